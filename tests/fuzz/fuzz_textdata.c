/* The text readers of sequence learning: the first byte picks the vocabulary file reader, the
 * labelled or tagged records of a .tsv file, or the tokenizer (characters or words, lowercased
 * or not) feeding a vocabulary builder whose result is written and read back. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "kiln/data.h"

static int count_record(void *user, const char *text, size_t len, int label, int line) {
  (void)text, (void)label, (void)line;
  *(size_t *)user += len;
  return KILN_OK;
}

static int count_tagged(void *user, const char *text, size_t len, const int32_t *tags,
                        size_t ntags, int line) {
  (void)text, (void)line;
  for (size_t i = 0; i < ntags; i++) *(size_t *)user += (size_t)tags[i] % 2;
  *(size_t *)user += len;
  return KILN_OK;
}

static void roundtrip(const uint8_t *data, size_t size, int how) {
  kiln_vocab_builder *b = NULL;
  if (kiln_vocab_builder_new(how & 1 ? KILN_TOKENS_WORD : KILN_TOKENS_CHAR, how & 2, &b)) return;
  kiln_vocab *v = NULL;
  if (kiln_vocab_builder_add(b, (const char *)data, size) == KILN_OK &&
      kiln_vocab_builder_finish(b, 1 + (how >> 2 & 1), how & 8 ? 5 : 0, &v) == KILN_OK) {
    const char *path = fuzz_temp_file(NULL, 0, ".vocab");
    kiln_vocab *back = NULL;
    if (path && kiln_vocab_write(v, path) == KILN_OK && kiln_vocab_read(path, &back) == KILN_OK &&
        kiln_vocab_size(back) != kiln_vocab_size(v))
      abort(); /* what is written must read back whole */
    kiln_vocab_free(back);
    if (path) remove(path);
  }
  kiln_vocab_free(v);
  kiln_vocab_builder_free(b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  switch (data[0] % 3) {
  case 0: {
    const char *path = fuzz_temp_file(data + 1, size - 1, ".vocab");
    kiln_vocab *v = NULL;
    if (path && kiln_vocab_read(path, &v) == KILN_OK) {
      for (int i = 0; i < kiln_vocab_size(v); i++) {
        size_t len;
        const char *t = kiln_vocab_token(v, i, &len);
        if (kiln_vocab_id(v, t, len) != i) abort(); /* every token finds its own id */
      }
      kiln_vocab_free(v);
    }
    if (path) remove(path);
    break;
  }
  case 1: {
    const char *path = fuzz_temp_file(data + 1, size - 1, ".tsv");
    size_t total = 0;
    if (path && data[0] / 3 % 2) (void)kiln_text_tagged_records(path, count_tagged, &total);
    else if (path) (void)kiln_text_records(path, count_record, &total);
    if (path) remove(path);
    break;
  }
  default: roundtrip(data + 1, size - 1, data[0] / 3); break;
  }
  return 0;
}
