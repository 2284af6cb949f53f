/* libFuzzer targets: each file defines LLVMFuzzerTestOneInput for one reader or parser. Built two
 * ways: with clang's libFuzzer (`make fuzz`, -DKILN_FUZZ=ON), and in every other build with
 * replay.c's main, which runs the stored corpus and every crash input ever found
 * (tests/fuzz/corpus/<target>/) through it under CTest, in the sanitizer build too. */
#ifndef KILN_FUZZ_H
#define KILN_FUZZ_H

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Writes the input to a fresh temporary file and returns its path (static storage), for readers
 * that take a path; NULL when it cannot. */
const char *fuzz_temp_file(const uint8_t *data, size_t size, const char *suffix);

#endif
