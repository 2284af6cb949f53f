/* Text into ids: the tokenizer (characters and words), vocabularies (building with cut-offs,
 * the file both ways, its damage), and the TextData layer: windows of a corpus with their next
 * tokens and cont, labelled sequences bucketed by length with padding, cont and mask, shuffling
 * from the seed, exact cursors, the workers' shares, and the bad inputs it refuses by file and
 * line. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "files.h"
#include "kiln/data.h"
#include "layer_test.h"

static char dir[64];

static int setup(void **state) {
  (void)state;
  make_tmpdir(dir, sizeof dir, "text");
  return 0;
}

static int teardown(void **state) {
  (void)state;
  rm_tree(dir);
  return 0;
}

static const char *in_dir(const char *name, char *buf, size_t n) {
  snprintf(buf, n, "%s/%s", dir, name);
  return buf;
}

static void write_file(const char *name, const char *text) {
  char path[256];
  write_plain(in_dir(name, path, sizeof path), text, strlen(text));
}

/* ---- tokens -------------------------------------------------------------------------------- */

typedef struct {
  char tok[32][32];
  int n;
} token_list;

static int collect(void *user, const char *tok, size_t len) {
  token_list *t = user;
  assert_true(t->n < 32 && len < 32);
  memcpy(t->tok[t->n], tok, len);
  t->tok[t->n++][len] = '\0';
  return KILN_OK;
}

static int stop_at_second(void *user, const char *tok, size_t len) {
  (void)tok, (void)len;
  return ++*(int *)user == 2 ? KILN_ERR_DATA : KILN_OK;
}

static void expect_tokens(const char *text, kiln_token_level level, bool lower, const char **want,
                          int n) {
  token_list t = {.n = 0};
  assert_int_equal(kiln_tokenize(text, strlen(text), level, lower, collect, &t), KILN_OK);
  for (int i = 0; i < n && i < t.n; i++)
    if (strcmp(t.tok[i], want[i])) fail_msg("'%s': token %d is '%s', want '%s'", text, i, t.tok[i], want[i]);
  assert_int_equal(t.n, n);
}

static void test_tokenizer(void **state) {
  (void)state;
  /* characters are code points; a byte that is no UTF-8 is a token of its own */
  const char *chars[] = {"h", "\xc3\xa9", " ", "W", ",", "\xff", "\n"};
  expect_tokens("h\xc3\xa9 W,\xff\n", KILN_TOKENS_CHAR, false, chars, 7);
  const char *lower[] = {"a", "b", "\xc3\x89"};
  expect_tokens("AB\xc3\x89", KILN_TOKENS_CHAR, true, lower, 3); /* ASCII only */
  /* words: runs of letters and digits with inner apostrophes; punctuation apart; an em dash
   * between words separates them */
  const char *words[] = {"Call", "me", "Ishmael", ".", "Ago", "\xe2\x80\x94", "never", "don't",
                         "'", "tis", "caf\xc3\xa9", "42nd", "!"};
  expect_tokens("Call me  Ishmael. Ago\xe2\x80\x94never don't 'tis caf\xc3\xa9 42nd!",
                KILN_TOKENS_WORD, false, words, 13);
  const char *lw[] = {"call", "me"};
  expect_tokens("CALL\tMe\n", KILN_TOKENS_WORD, true, lw, 2);
  /* a status from the callback stops the walk and comes back */
  int calls = 0;
  assert_int_equal(kiln_tokenize("abc", 3, KILN_TOKENS_CHAR, false, stop_at_second, &calls),
                   KILN_ERR_DATA);
  assert_int_equal(calls, 2);
}

/* ---- vocabularies -------------------------------------------------------------------------- */

static kiln_vocab *build_vocab(const char *text, kiln_token_level level, int64_t min_count,
                               int max_size) {
  kiln_vocab_builder *b;
  assert_int_equal(kiln_vocab_builder_new(level, false, &b), KILN_OK);
  assert_int_equal(kiln_vocab_builder_add(b, text, strlen(text)), KILN_OK);
  kiln_vocab *v;
  assert_int_equal(kiln_vocab_builder_finish(b, min_count, max_size, &v), KILN_OK);
  kiln_vocab_builder_free(b);
  return v;
}

static void expect_token(const kiln_vocab *v, int id, const char *want) {
  size_t len;
  const char *t = kiln_vocab_token(v, id, &len);
  assert_non_null(t);
  assert_int_equal(len, strlen(want));
  assert_memory_equal(t, want, len);
}

static void test_vocab_build_and_file(void **state) {
  (void)state;
  /* counts: a 4, ' ' 3, b 2, \n 1, \\ 1: ties in byte order ('\n' < '\\') */
  kiln_vocab *v = build_vocab("a a a\\ab\nb", KILN_TOKENS_CHAR, 1, 0);
  assert_int_equal(kiln_vocab_size(v), 7);
  assert_int_equal(kiln_vocab_pad_id(v), 0);
  assert_int_equal(kiln_vocab_unk_id(v), 1);
  const char *order[] = {"<pad>", "<unk>", "a", " ", "b", "\n", "\\"};
  for (int i = 0; i < 7; i++) expect_token(v, i, order[i]);
  assert_int_equal(kiln_vocab_id(v, "b", 1), 4);
  assert_int_equal(kiln_vocab_id(v, "z", 1), -1);
  /* the file: escaped, read back the same */
  char path[256];
  in_dir("v.txt", path, sizeof path);
  assert_int_equal(kiln_vocab_write(v, path), KILN_OK);
  char *text;
  size_t n;
  assert_int_equal(kiln_read_file(path, &text, &n), KILN_OK);
  assert_string_equal(text, "# kiln vocabulary: level char, lowercase 0, 7 tokens\n"
                            "<pad>\n<unk>\na\n\\s\nb\n\\n\n\\\\\n");
  free(text);
  kiln_vocab *r;
  assert_int_equal(kiln_vocab_read(path, &r), KILN_OK);
  assert_int_equal(kiln_vocab_size(r), 7);
  for (int i = 0; i < 7; i++) expect_token(r, i, order[i]);
  assert_int_equal(kiln_vocab_level(r), KILN_TOKENS_CHAR);
  kiln_vocab_free(r);
  kiln_vocab_free(v);
  /* the cut-offs: at least twice, at most 4 tokens in all */
  v = build_vocab("x y y z z z w w w w", KILN_TOKENS_WORD, 2, 0);
  assert_int_equal(kiln_vocab_size(v), 5); /* pad, unk, w, z, y */
  expect_token(v, 2, "w");
  expect_token(v, 4, "y");
  kiln_vocab_free(v);
  v = build_vocab("x y y z z z w w w w", KILN_TOKENS_WORD, 1, 4);
  assert_int_equal(kiln_vocab_size(v), 4);
  expect_token(v, 3, "z");
  kiln_vocab_free(v);
  kiln_vocab_builder *b;
  assert_int_equal(kiln_vocab_builder_new(KILN_TOKENS_WORD, false, &b), KILN_OK);
  assert_int_equal(kiln_vocab_builder_finish(b, 1, 2, &v), KILN_ERR_INVALID);
  expect_message("the largest vocabulary 2", NULL, NULL);
  kiln_vocab_builder_free(b);
}

static void expect_bad_vocab(const char *text, const char *want) {
  char path[256];
  write_file("bad.txt", text);
  kiln_vocab *v = NULL;
  assert_int_equal(kiln_vocab_read(in_dir("bad.txt", path, sizeof path), &v), KILN_ERR_PARSE);
  assert_null(v);
  expect_message(path, want, NULL);
}

static void test_vocab_damage(void **state) {
  (void)state;
  expect_bad_vocab("<pad>\n", ":1: not a kiln vocabulary");
  expect_bad_vocab("# kiln vocabulary: level byte, lowercase 0, 1 tokens\na\n", ":1: not a kiln");
  expect_bad_vocab("# kiln vocabulary: level char, lowercase 0, 3 tokens\na\nb\na\n",
                   ":4: token 'a' given twice (first at line 2)");
  expect_bad_vocab("# kiln vocabulary: level char, lowercase 0, 1 tokens\n\\q\n", ":2: a backslash");
  expect_bad_vocab("# kiln vocabulary: level char, lowercase 0, 2 tokens\na\n\n", ":3: an empty token");
  expect_bad_vocab("# kiln vocabulary: level char, lowercase 0, 3 tokens\na\nb\n", "2 tokens, but its first line says 3");
  expect_bad_vocab("# kiln vocabulary: level char, lowercase 0, 2 tokens\na\nb", ":3: the last line has no newline");
}

/* ---- TextData: windows --------------------------------------------------------------------- */

/* A char vocabulary of `corpus` (file corpus.txt, vocabulary vocab.txt beside it). */
static kiln_vocab *corpus(const char *text) {
  write_file("corpus.txt", text);
  kiln_vocab *v = build_vocab(text, KILN_TOKENS_CHAR, 1, 0);
  char path[256];
  assert_int_equal(kiln_vocab_write(v, in_dir("vocab.txt", path, sizeof path)), KILN_OK);
  return v;
}

static built text_layer(const char *params, int ntop, int phase) {
  char text[1024];
  snprintf(text, sizeof text, "name: 'txt' type: 'TextData' text_data_param { source: '%s/%s' %s }",
           dir, strstr(params, "SEQUENCES") ? "records.tsv" : "corpus.txt", params);
  return build(text, phase, NULL, 0, ntop);
}

static int id_of(const kiln_vocab *v, char c) { return kiln_vocab_id(v, &c, 1); }

/* Window w of "abcdefghij" with T = 3: data from 3w, labels one further. */
static void expect_window(const kiln_vocab *v, const built *b, int n, int w, int N) {
  const char *text = "abcdefghij";
  for (int t = 0; t < 3; t++) {
    int64_t i = (int64_t)t * N + n;
    assert_int_equal((int)b->top[0]->data[i], id_of(v, text[3 * w + t]));
    assert_int_equal((int)b->top[1]->data[i], id_of(v, text[3 * w + t + 1]));
    assert_int_equal((int)b->top[2]->data[i], t ? 1 : 0);
  }
}

static void test_windows(void **state) {
  (void)state;
  kiln_vocab *v = corpus("abcdefghij");
  /* 10 tokens, T = 3: windows abc|def|ghi (3 of them), batches of 2, wrapping */
  built b = text_layer("batch_size: 2 seq_len: 3", 3, TRAIN);
  expect_shape(b.top[0], 2, SHAPE(3, 2));
  expect_shape(b.top[1], 2, SHAPE(3, 2));
  forward(&b);
  expect_window(v, &b, 0, 0, 2);
  expect_window(v, &b, 1, 1, 2);
  forward(&b);
  expect_window(v, &b, 0, 2, 2);
  expect_window(v, &b, 1, 0, 2);
  assert_int_equal(b.l->ops->get_cursor(b.l), 4);
  /* resumed at the cursor: the same next batch as the straight run */
  built r = text_layer("batch_size: 2 seq_len: 3", 3, TRAIN);
  assert_int_equal(r.l->ops->set_cursor(r.l, 4), KILN_OK);
  forward(&b);
  forward(&r);
  expect_close("resumed", r.top[0]->data, b.top[0]->data, 6, 0);
  expect_close("resumed labels", r.top[1]->data, b.top[1]->data, 6, 0);
  unbuild(&r);
  unbuild(&b);
  kiln_vocab_free(v);
}

/* Shuffled: each epoch a permutation of the windows, the same from the same seed; two workers
 * read together what one reads, batch by batch. */
static void test_windows_shuffled_and_shared(void **state) {
  (void)state;
  /* 300 distinct characters (U+0100 ...), so a window is known by its first token */
  char text[601];
  for (int i = 0; i < 300; i++) {
    int cp = 0x100 + i;
    text[2 * i] = (char)(0xc0 | (cp >> 6));
    text[2 * i + 1] = (char)(0x80 | (cp & 0x3f));
  }
  text[600] = '\0';
  kiln_vocab *v = corpus(text);
  /* 299 / 4 = 74 windows; batches of 2; 37 batches an epoch */
  built a = text_layer("batch_size: 2 seq_len: 4 shuffle: true", 2, TRAIN);
  built twin = text_layer("batch_size: 2 seq_len: 4 shuffle: true", 2, TRAIN);
  int seen[74] = {0}, in_order = 0;
  for (int k = 0; k < 37; k++) {
    forward(&a);
    forward(&twin);
    expect_close("same seed", twin.top[0]->data, a.top[0]->data, 8, 0);
    for (int n = 0; n < 2; n++) {
      /* which window: its first token */
      int found = -1;
      for (int w = 0; w < 74 && found < 0; w++)
        if ((int)a.top[0]->data[n] == kiln_vocab_id(v, text + 2 * 4 * w, 2)) found = w;
      assert_true(found >= 0);
      seen[found]++;
      in_order += found == 2 * k + n;
    }
  }
  for (int w = 0; w < 74; w++) assert_int_equal(seen[w], 1);
  assert_true(in_order < 20);
  unbuild(&twin);
  /* two workers: worker r's batch k is the single reader's batch 2k + r */
  built one = text_layer("batch_size: 2 seq_len: 4 shuffle: true", 1, TRAIN);
  built w[2];
  for (int r = 0; r < 2; r++) {
    w[r] = text_layer("batch_size: 2 seq_len: 4 shuffle: true", 1, TRAIN);
    w[r].l->shard_rank = r;
    w[r].l->shard_count = 2;
  }
  for (int k = 0; k < 20; k++)
    for (int r = 0; r < 2; r++) {
      forward(&one);
      forward(&w[r]);
      expect_close("worker share", w[r].top[0]->data, one.top[0]->data, 8, 0);
    }
  assert_int_equal(w[0].l->ops->get_cursor(w[0].l), one.l->ops->get_cursor(one.l));
  assert_int_equal(w[1].l->ops->get_cursor(w[1].l), one.l->ops->get_cursor(one.l));
  for (int r = 0; r < 2; r++) unbuild(&w[r]);
  unbuild(&one);
  unbuild(&a);
  kiln_vocab_free(v);
}

/* ---- TextData: labelled sequences ---------------------------------------------------------- */

static void test_sequences_bucketed(void **state) {
  (void)state;
  /* lengths 3, 1, 4, 2, 3 -> by length, ties by line: r1 (1), r3 (2), r0 (3), r4 (3), r2 (4) */
  write_file("records.tsv", "0\tabc\n1\td\n0\tefgh\n1\tij\n0\tk\\tl\n");
  kiln_vocab *v = build_vocab("abcdefghijk\tl", KILN_TOKENS_CHAR, 1, 0);
  char path[256];
  assert_int_equal(kiln_vocab_write(v, in_dir("vocab.txt", path, sizeof path)), KILN_OK);
  built b = text_layer("mode: SEQUENCES batch_size: 2 seq_len: 4", 4, TRAIN);
  expect_shape(b.top[0], 2, SHAPE(4, 2)); /* planned at the longest */
  expect_shape(b.top[1], 1, SHAPE(2));
  forward(&b); /* bucket 0: "d" (1), "ij" (1): T = 2 */
  expect_shape(b.top[0], 2, SHAPE(2, 2));
  const float data0[] = {id_of(v, 'd'), id_of(v, 'i'), 0, id_of(v, 'j')};
  const float cont0[] = {0, 0, 0, 1}, mask0[] = {1, 1, 0, 1}, label0[] = {1, 1};
  expect_close("data", b.top[0]->data, data0, 4, 0);
  expect_close("label", b.top[1]->data, label0, 2, 0);
  expect_close("cont", b.top[2]->data, cont0, 4, 0);
  expect_close("mask", b.top[3]->data, mask0, 4, 0);
  forward(&b); /* bucket 1: "abc" (0), "k<TAB>l" (0): T = 3 */
  expect_shape(b.top[0], 2, SHAPE(3, 2));
  const float data1[] = {id_of(v, 'a'), id_of(v, 'k'), id_of(v, 'b'), id_of(v, '\t'), id_of(v, 'c'), id_of(v, 'l')};
  const float cont1[] = {0, 0, 1, 1, 1, 1};
  expect_close("data", b.top[0]->data, data1, 6, 0);
  expect_close("cont", b.top[2]->data, cont1, 6, 0);
  forward(&b); /* bucket 2: "efgh" alone: T = 4, N = 1 */
  expect_shape(b.top[0], 2, SHAPE(4, 1));
  expect_shape(b.top[1], 1, SHAPE(1));
  assert_int_equal((int)b.top[0]->data[3], id_of(v, 'h'));
  assert_int_equal(b.l->ops->get_cursor(b.l), 3);
  forward(&b); /* the next epoch starts again */
  expect_shape(b.top[0], 2, SHAPE(2, 2));
  unbuild(&b);
  /* a missing source, named */
  char text[1024];
  snprintf(text, sizeof text, "name: 't' type: 'TextData' text_data_param { source: '%s/nothere.tsv' "
           "vocab: '%s' mode: SEQUENCES batch_size: 2 seq_len: 3 }", dir, path);
  expect_create_fails(text, TRAIN, NULL, 0, 2, KILN_ERR_IO, "layer 't' (TextData)", "nothere.tsv");
  /* too long for seq_len 3 unless truncated */
  snprintf(text, sizeof text, "name: 't' type: 'TextData' text_data_param { source: '%s/records.tsv' "
           "mode: SEQUENCES batch_size: 2 seq_len: 3 }", dir);
  expect_fails_ex(text, TRAIN, NULL, 0, 2, false, KILN_ERR_DATA, "layer 't' (TextData)",
                  "records.tsv:3: a sequence of 4 tokens, longer than text_data_param.seq_len 3",
                  "truncate: true");
  built t = text_layer("mode: SEQUENCES batch_size: 5 seq_len: 3 truncate: true", 2, TRAIN);
  forward(&t);
  expect_shape(t.top[0], 2, SHAPE(3, 5));
  unbuild(&t);
  kiln_vocab_free(v);
}

static void test_bad_text_inputs(void **state) {
  (void)state;
  char text[1024];
  const char *who = "layer 't' (TextData)";
  kiln_vocab *v = corpus("abcdefghij");
  kiln_vocab_free(v);
#define LAYER(src, extra)                                                                          \
  (snprintf(text, sizeof text, "name: 't' type: 'TextData' text_data_param { source: '%s/%s' %s }", \
            dir, src, extra),                                                                      \
   text)
  /* an empty corpus */
  write_file("empty.txt", "");
  expect_fails_ex(LAYER("empty.txt", "vocab: 'vocab.txt' batch_size: 1 seq_len: 2"), TRAIN, NULL, 0, 1, false,
                  KILN_ERR_IO, who, "vocab.txt", NULL);
  char vpath[256];
  in_dir("vocab.txt", vpath, sizeof vpath);
  snprintf(text, sizeof text, "name: 't' type: 'TextData' text_data_param { source: '%s/empty.txt' "
           "vocab: '%s' batch_size: 1 seq_len: 2 }", dir, vpath);
  expect_fails_ex(text, TRAIN, NULL, 0, 1, false, KILN_ERR_DATA, who, "empty.txt: no tokens", NULL);
  /* a corpus shorter than a window */
  write_file("short.txt", "abc");
  snprintf(text, sizeof text, "name: 't' type: 'TextData' text_data_param { source: '%s/short.txt' "
           "batch_size: 1 seq_len: 3 }", dir);
  expect_fails_ex(text, TRAIN, NULL, 0, 1, false, KILN_ERR_DATA, who, "3 tokens, fewer than one window", NULL);
  /* a token outside a vocabulary with no <unk> */
  write_file("nounk.txt", "# kiln vocabulary: level char, lowercase 0, 2 tokens\na\nb\n");
  write_file("ab.txt", "abab\nabz");
  snprintf(text, sizeof text, "name: 't' type: 'TextData' text_data_param { source: '%s/ab.txt' "
           "vocab: '%s/nounk.txt' batch_size: 1 seq_len: 2 }", dir, dir);
  expect_fails_ex(text, TRAIN, NULL, 0, 1, false, KILN_ERR_DATA, who, "ab.txt:1: token '\n'", "which has no <unk>");
  /* a vocabulary that is not the data's: most tokens unknown */
  write_file("other.txt", "zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzab");
  snprintf(text, sizeof text, "name: 't' type: 'TextData' text_data_param { source: '%s/other.txt' "
           "vocab: '%s' batch_size: 1 seq_len: 2 }", dir, vpath);
  expect_fails_ex(text, TRAIN, NULL, 0, 1, false, KILN_ERR_DATA, who, "30 of the 32 tokens", "not this text's vocabulary");
  /* SEQUENCES needs labelled records and a <pad> */
  snprintf(text, sizeof text, "name: 't' type: 'TextData' text_data_param { source: '%s/ab.txt' "
           "vocab: '%s' mode: SEQUENCES batch_size: 1 seq_len: 8 }", dir, vpath);
  expect_fails_ex(text, TRAIN, NULL, 0, 1, false, KILN_ERR_DATA, who, "LABEL<TAB>TEXT", NULL);
  write_file("rec.tsv", "1\tab\n");
  snprintf(text, sizeof text, "name: 't' type: 'TextData' text_data_param { source: '%s/rec.tsv' "
           "vocab: '%s/nounk.txt' mode: SEQUENCES batch_size: 1 seq_len: 8 }", dir, dir);
  expect_fails_ex(text, TRAIN, NULL, 0, 1, false, KILN_ERR_DATA, who, "has no <pad> token", NULL);
  /* a malformed record line: named by file and line */
  write_file("bad.tsv", "1\tab\nx\tab\n");
  snprintf(text, sizeof text, "name: 't' type: 'TextData' text_data_param { source: '%s/bad.tsv' "
           "vocab: '%s' mode: SEQUENCES batch_size: 1 seq_len: 8 }", dir, vpath);
  expect_fails_ex(text, TRAIN, NULL, 0, 1, false, KILN_ERR_PARSE, who, "bad.tsv:2: label 'x'", NULL);
  write_file("empty.tsv", "1\tab\n0\t\n");
  snprintf(text, sizeof text, "name: 't' type: 'TextData' text_data_param { source: '%s/empty.tsv' "
           "vocab: '%s' mode: SEQUENCES batch_size: 1 seq_len: 8 }", dir, vpath);
  expect_fails_ex(text, TRAIN, NULL, 0, 1, false, KILN_ERR_DATA, who, "empty.tsv:2: a record without tokens", NULL);
  /* parameters */
  expect_create_fails(LAYER("corpus.txt", "seq_len: 2"), TRAIN, NULL, 0, 1, KILN_ERR_INVALID, who,
                      "batch_size must be set");
  expect_create_fails(LAYER("corpus.txt", "batch_size: 2"), TRAIN, NULL, 0, 1, KILN_ERR_INVALID, who,
                      "seq_len must be set");
  expect_create_fails(LAYER("corpus.txt", "batch_size: 2 seq_len: 2"), TRAIN, NULL, 0, 4,
                      KILN_ERR_INVALID, who, "mode WINDOWS has at most 3 tops");
#undef LAYER
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_tokenizer),
      cmocka_unit_test(test_vocab_build_and_file),
      cmocka_unit_test(test_vocab_damage),
      cmocka_unit_test(test_windows),
      cmocka_unit_test(test_windows_shuffled_and_shared),
      cmocka_unit_test(test_sequences_bucketed),
      cmocka_unit_test(test_bad_text_inputs),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
