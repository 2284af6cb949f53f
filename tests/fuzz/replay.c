/* Runs every file named on the command line (folders: every file inside, sorted by name) through
 * the target's LLVMFuzzerTestOneInput once: the corpus and the crash inputs replayed as a test.
 * Exits 0 when all ran; a fault ends the process (and the sanitizer build reports it). */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"
#include "kiln/core.h"

static int run_file(const char *path) {
  char *buf;
  size_t n;
  if (kiln_read_file(path, &buf, &n)) {
    fprintf(stderr, "replay: %s\n", kiln_last_error());
    return 1;
  }
  LLVMFuzzerTestOneInput((const uint8_t *)buf, n);
  free(buf);
  return 0;
}

static int cmp(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv) {
  int bad = 0, ran = 0;
  for (int i = 1; i < argc; i++) {
    struct stat st;
    if (stat(argv[i], &st) != 0) {
      fprintf(stderr, "replay: %s: missing\n", argv[i]);
      bad = 1;
      continue;
    }
    if (!S_ISDIR(st.st_mode)) {
      bad |= run_file(argv[i]);
      ran++;
      continue;
    }
    DIR *d = opendir(argv[i]);
    if (!d) continue;
    char **names = NULL;
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
      if (e->d_name[0] == '.') continue;
      char **nn = realloc(names, (n + 1) * sizeof *nn);
      if (!nn) break;
      names = nn;
      names[n] = malloc(strlen(argv[i]) + strlen(e->d_name) + 2);
      if (!names[n]) break;
      sprintf(names[n++], "%s/%s", argv[i], e->d_name);
    }
    closedir(d);
    if (n > 1) qsort(names, n, sizeof *names, cmp);
    for (size_t k = 0; k < n; k++) {
      bad |= run_file(names[k]);
      ran++;
      free(names[k]);
    }
    free(names);
  }
  printf("replayed %d inputs\n", ran);
  return bad || ran == 0;
}
