/* Text into ids: the tokenizer (characters and words), vocabularies (building with cut-offs,
 * the file both ways, its damage), and the TextData layer: windows of a corpus with their next
 * tokens and cont, labelled sequences bucketed by length with padding, cont and mask, tagged
 * sequences batched the same way with a tag per step, source-target pairs batched by the source's
 * length with a start and an end around each target, shuffling from the seed, exact cursors, the
 * workers' shares, and the bad inputs it refuses by file and line; the records of a .tsv of pairs;
 * the edit distance between token sequences. */
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
  /* reserved tokens: right after <pad> and <unk>, whatever the text, and counted in max_size */
  assert_int_equal(kiln_vocab_builder_new(KILN_TOKENS_WORD, false, &b), KILN_OK);
  assert_int_equal(kiln_vocab_builder_reserve(b, "<s>"), KILN_OK);
  assert_int_equal(kiln_vocab_builder_reserve(b, "</s>"), KILN_OK);
  assert_int_equal(kiln_vocab_builder_add(b, "y x y", 5), KILN_OK);
  assert_int_equal(kiln_vocab_builder_finish(b, 1, 4, &v), KILN_ERR_INVALID);
  expect_message("the largest vocabulary 4: expected 0 (no limit) or 5", "reserved", NULL);
  assert_int_equal(kiln_vocab_builder_finish(b, 1, 5, &v), KILN_OK);
  const char *reserved[] = {"<pad>", "<unk>", "<s>", "</s>", "y"};
  assert_int_equal(kiln_vocab_size(v), 5);
  for (int i = 0; i < 5; i++) expect_token(v, i, reserved[i]);
  kiln_vocab_free(v);
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

/* Writes `text` as `file` and the char vocabulary of `chars` as vocab.txt beside it. */
static kiln_vocab *text_file(const char *file, const char *text, const char *chars) {
  write_file(file, text);
  kiln_vocab *v = build_vocab(chars, KILN_TOKENS_CHAR, 1, 0);
  char path[256];
  assert_int_equal(kiln_vocab_write(v, in_dir("vocab.txt", path, sizeof path)), KILN_OK);
  return v;
}

/* A char vocabulary of `corpus` (file corpus.txt, vocabulary vocab.txt beside it). */
static kiln_vocab *corpus(const char *text) { return text_file("corpus.txt", text, text); }

static built text_layer(const char *params, int ntop, int phase) {
  char text[1024];
  snprintf(text, sizeof text, "name: 'txt' type: 'TextData' text_data_param { source: '%s/%s' %s }",
           dir,
           strstr(params, "SEQUENCES") ? "records.tsv"
           : strstr(params, "TAGGED")  ? "tagged.tsv"
           : strstr(params, "PAIRS")   ? "pairs.tsv"
                                       : "corpus.txt",
           params);
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
  kiln_vocab *v = text_file("records.tsv", "0\tabc\n1\td\n0\tefgh\n1\tij\n0\tk\\tl\n",
                            "abcdefghijk\tl");
  char path[256];
  in_dir("vocab.txt", path, sizeof path);
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
  /* set but out of range: the value and the range, not "must be set" */
  expect_create_fails(LAYER("corpus.txt", "batch_size: 2 seq_len: 2147483647"), TRAIN, NULL, 0, 1,
                      KILN_ERR_INVALID, who, "seq_len 2147483647 is out of range: 1 to 1048576");
  expect_create_fails(LAYER("corpus.txt", "batch_size: 2 seq_len: 0"), TRAIN, NULL, 0, 1,
                      KILN_ERR_INVALID, who, "seq_len 0 is out of range: 1 to 1048576");
  expect_create_fails(LAYER("corpus.txt", "batch_size: 2000000 seq_len: 2"), TRAIN, NULL, 0, 1,
                      KILN_ERR_INVALID, who, "batch_size 2000000 is out of range: 1 to 1048576");
  expect_create_fails(LAYER("corpus.txt", "batch_size: 2 seq_len: 2"), TRAIN, NULL, 0, 4,
                      KILN_ERR_INVALID, who, "mode WINDOWS has at most 3 tops");
#undef LAYER
}

/* ---- TextData: tagged sequences ------------------------------------------------------------ */

/* The records of test_sequences_bucketed with a tag per character instead of a label: the same
 * buckets, and label T x N, each step's tag and pad_label (default -1) on padding. */
static void test_tagged_bucketed(void **state) {
  (void)state;
  kiln_vocab *v = text_file("tagged.tsv",
                            "1 0 0\tabc\n1\td\n1 0  1 0\tefgh\n0 1\tij\n1 0 1\tk\\tl\n",
                            "abcdefghijk\tl");
  built b = text_layer("mode: TAGGED batch_size: 2 seq_len: 4", 4, TRAIN);
  expect_shape(b.top[0], 2, SHAPE(4, 2));
  expect_shape(b.top[1], 2, SHAPE(4, 2)); /* a tag per step, planned at the longest */
  forward(&b); /* bucket 0: "d" (1), "ij" (0 1): T = 2 */
  expect_shape(b.top[1], 2, SHAPE(2, 2));
  const float data0[] = {id_of(v, 'd'), id_of(v, 'i'), 0, id_of(v, 'j')};
  const float label0[] = {1, 0, -1, 1}, cont0[] = {0, 0, 0, 1}, mask0[] = {1, 1, 0, 1};
  expect_close("data", b.top[0]->data, data0, 4, 0);
  expect_close("tags", b.top[1]->data, label0, 4, 0);
  expect_close("cont", b.top[2]->data, cont0, 4, 0);
  expect_close("mask", b.top[3]->data, mask0, 4, 0);
  forward(&b); /* bucket 1: "abc" (1 0 0), "k<TAB>l" (1 0 1): T = 3 */
  const float label1[] = {1, 1, 0, 0, 0, 1};
  expect_shape(b.top[1], 2, SHAPE(3, 2));
  expect_close("tags", b.top[1]->data, label1, 6, 0);
  forward(&b); /* bucket 2: "efgh" alone (1 0 1 0; two spaces separate as one) */
  const float label2[] = {1, 0, 1, 0};
  expect_shape(b.top[1], 2, SHAPE(4, 1));
  expect_close("tags", b.top[1]->data, label2, 4, 0);
  unbuild(&b);
  /* pad_label for the loss's ignore_label; truncate keeps the first seq_len tags */
  built t = text_layer("mode: TAGGED batch_size: 5 seq_len: 3 truncate: true pad_label: 9", 2,
                       TRAIN);
  forward(&t); /* by length: d, ij, abc, k<TAB>l, efgh cut to efg */
  expect_shape(t.top[1], 2, SHAPE(3, 5));
  const float tags[] = {1, 0, 1, 1, 1, 9, 1, 0, 0, 0, 9, 9, 0, 1, 1};
  expect_close("truncated tags", t.top[1]->data, tags, 15, 0);
  unbuild(&t);
  kiln_vocab_free(v);
}

/* A word-level target vocabulary: ids <pad> 0, <unk> 1, <s> 2, </s> 3, A 4, B 5, C 6. */
#define TARGET_VOCAB \
  "# kiln vocabulary: level word, lowercase 0, 7 tokens\n<pad>\n<unk>\n<s>\n</s>\nA\nB\nC\n"

/* TAGGED and PAIRS batch as SEQUENCES does: over the same texts (PAIRS' sources), with
 * shuffling and two workers, the modes serve the same data, cont and mask batch by batch, and
 * the same cursors; a layer resumed at a cursor serves what the straight run serves next. */
static void test_tagged_batches_as_sequences(void **state) {
  (void)state;
  /* 23 records of 1 to 6 characters: a, bb, ccc, ... (by length with ties, so buckets mix) */
  char labelled[4096] = "", tagged[4096] = "", pairs[4096] = "", alphabet[64] = "";
  for (int r = 0; r < 23; r++) {
    int len = 1 + (r * 7) % 6;
    char text[8], tags[16] = "", line[64];
    for (int k = 0; k < len; k++) {
      text[k] = (char)('a' + (r + k) % 20);
      strcat(tags, k ? " 0" : "1");
    }
    text[len] = '\0';
    snprintf(line, sizeof line, "%d\t%s\n", r % 2, text);
    strcat(labelled, line);
    snprintf(line, sizeof line, "%s\t%s\n", tags, text);
    strcat(tagged, line);
    snprintf(line, sizeof line, "%s\t%.*s\n", text, r % 4, "A B C");
    strcat(pairs, line);
  }
  for (int k = 0; k < 20; k++) alphabet[k] = (char)('a' + k);
  write_file("records.tsv", labelled);
  write_file("pairs.tsv", pairs);
  write_file("target_vocab.txt", TARGET_VOCAB);
  kiln_vocab *v = text_file("tagged.tsv", tagged, alphabet);
  const char *common = "batch_size: 3 seq_len: 6 shuffle: true";
  char seq_params[128], tag_params[128], pair_params[128];
  snprintf(seq_params, sizeof seq_params, "mode: SEQUENCES %s", common);
  snprintf(tag_params, sizeof tag_params, "mode: TAGGED %s", common);
  snprintf(pair_params, sizeof pair_params, "mode: PAIRS target_len: 4 %s", common);
  for (int r = 0; r < 2; r++) {
    built sq = text_layer(seq_params, 4, TRAIN), tg = text_layer(tag_params, 4, TRAIN);
    built pr = text_layer(pair_params, 6, TRAIN);
    sq.l->shard_rank = tg.l->shard_rank = pr.l->shard_rank = r;
    sq.l->shard_count = tg.l->shard_count = pr.l->shard_count = 2;
    for (int k = 0; k < 12; k++) { /* 8 buckets: three epochs between the two workers */
      forward(&sq);
      forward(&tg);
      forward(&pr);
      for (int t = 0; t < 4; t += t ? 1 : 2) { /* data, cont, mask */
        expect_shape(tg.top[t], 2, sq.top[t]->shape);
        expect_close("as SEQUENCES", tg.top[t]->data, sq.top[t]->data, sq.top[t]->count, 0);
      }
      /* PAIRS' source, source_mask and source_cont are SEQUENCES' data, mask and cont */
      const int as_seq[3] = {0, 3, 2};
      for (int t = 0; t < 3; t++) {
        expect_shape(pr.top[t], 2, sq.top[as_seq[t]]->shape);
        expect_close("source as SEQUENCES", pr.top[t]->data, sq.top[as_seq[t]]->data,
                     sq.top[as_seq[t]]->count, 0);
      }
      /* each sequence's first step is tagged 1, its others 0, its padding -1 */
      int64_t T = tg.top[1]->shape[0], N = tg.top[1]->shape[1];
      for (int64_t i = 0; i < T * N; i++) {
        float want = tg.top[3]->data[i] == 0 ? -1 : i < N ? 1 : 0;
        assert_int_equal((int)tg.top[1]->data[i], (int)want);
      }
    }
    assert_int_equal(tg.l->ops->get_cursor(tg.l), sq.l->ops->get_cursor(sq.l));
    assert_int_equal(pr.l->ops->get_cursor(pr.l), sq.l->ops->get_cursor(sq.l));
    unbuild(&sq);
    unbuild(&tg);
    unbuild(&pr);
  }
  const struct {
    const char *params;
    int ntop;
  } modes[2] = {{tag_params, 4}, {pair_params, 6}};
  for (int m = 0; m < 2; m++) {
    built a = text_layer(modes[m].params, modes[m].ntop, TRAIN);
    built b = text_layer(modes[m].params, modes[m].ntop, TRAIN);
    for (int k = 0; k < 5; k++) forward(&a);
    assert_int_equal(b.l->ops->set_cursor(b.l, a.l->ops->get_cursor(a.l)), KILN_OK);
    forward(&a);
    forward(&b);
    for (int t = 0; t < modes[m].ntop; t++) {
      expect_shape(b.top[t], 2, a.top[t]->shape);
      expect_close("resumed", b.top[t]->data, a.top[t]->data, a.top[t]->count, 0);
    }
    unbuild(&a);
    unbuild(&b);
  }
  kiln_vocab_free(v);
}

/* Tags per token of the vocabulary's tokenizer (words here), and the lines refused by file and
 * line: a count that differs, a tag that is no whole number, a missing tab; and a source that
 * is not .tsv. */
static void test_tagged_bad_records(void **state) {
  (void)state;
  const char *who = "layer 't' (TextData)";
  kiln_vocab *v = build_vocab("call me ishmael .", KILN_TOKENS_WORD, 1, 0);
  char vpath[256], text[1024];
  assert_int_equal(kiln_vocab_write(v, in_dir("words.txt", vpath, sizeof vpath)), KILN_OK);
#define TAGGED(src)                                                                                \
  (snprintf(text, sizeof text, "name: 't' type: 'TextData' text_data_param { source: '%s/%s' "     \
            "vocab: '%s' mode: TAGGED batch_size: 2 seq_len: 8 }", dir, src, vpath), text)
  write_file("w.tsv", "0 1 2 3\tcall me ishmael.\n");
  built b = build(TAGGED("w.tsv"), TRAIN, NULL, 0, 2);
  forward(&b);
  const float want[] = {0, 1, 2, 3};
  expect_shape(b.top[1], 2, SHAPE(4, 1));
  expect_close("word tags", b.top[1]->data, want, 4, 0);
  unbuild(&b);
  const struct {
    const char *file, *text;
    int code;
    const char *want, *want2;
  } bad[] = {
      {"count.tsv", "0 1 2 3\tcall me ishmael.\n1 0\tcall me ishmael\n", KILN_ERR_DATA,
       "count.tsv:2: 2 tags for 3 tokens", "one tag per token"},
      {"notnum.tsv", "0 1 2 3\tcall me ishmael.\n1 -1 0\tcall me ishmael\n", KILN_ERR_PARSE,
       "notnum.tsv:2: tag 2 '-1' is not a whole number", NULL},
      {"big.tsv", "0 2147483648 0\tcall me ishmael\n", KILN_ERR_PARSE,
       "big.tsv:1: tag 2 '2147483648'", NULL},
      {"notab.tsv", "0 1 2 3\tcall me ishmael.\n\n", KILN_ERR_PARSE,
       "notab.tsv:2: no tab: a line is TAGS<TAB>TEXT", NULL},
      {"empty.tsv", "\t\n", KILN_ERR_DATA, "empty.tsv:1: a record without tokens", NULL},
      {"plain.txt", "call me\n", KILN_ERR_DATA, "plain.txt: tagged records are a .tsv file",
       NULL},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    write_file(bad[i].file, bad[i].text);
    expect_fails_ex(TAGGED(bad[i].file), TRAIN, NULL, 0, 2, false, bad[i].code, who, bad[i].want,
                    bad[i].want2);
  }
#undef TAGGED
  kiln_vocab_free(v);
}

/* ---- TextData: source-target pairs ------------------------------------------------------- */

/* Records by source length, ties by line: "c" (line 2), "ab" (1), "de" (4), "abc" (3). */
static const char pairs_text[] = "ab\tA B\nc\tC\nabc\tA B C\nde\tC C C C\n";

static void test_pairs_bucketed(void **state) {
  (void)state;
  kiln_vocab *v = text_file("pairs.tsv", pairs_text, "abcde");
  write_file("target_vocab.txt", TARGET_VOCAB);
  built b = text_layer("mode: PAIRS batch_size: 2 seq_len: 4 target_len: 6", 6, TRAIN);
  for (int t = 0; t < 6; t++) expect_shape(b.top[t], 2, t < 3 ? SHAPE(4, 2) : SHAPE(6, 2));
  forward(&b); /* "c" -> C, "ab" -> A B: S = 2, T = 3 (the longer target and its </s>) */
  for (int t = 0; t < 6; t++) expect_shape(b.top[t], 2, t < 3 ? SHAPE(2, 2) : SHAPE(3, 2));
  const float src0[] = {id_of(v, 'c'), id_of(v, 'a'), 0, id_of(v, 'b')};
  const float smask0[] = {1, 1, 0, 1}, scont0[] = {0, 0, 0, 1};
  const float in0[] = {2, 2, 6, 4, 0, 5}, out0[] = {6, 4, 3, 5, -1, 3};
  const float tcont0[] = {0, 0, 1, 1, 0, 1};
  expect_close("source", b.top[0]->data, src0, 4, 0);
  expect_close("source_mask", b.top[1]->data, smask0, 4, 0);
  expect_close("source_cont", b.top[2]->data, scont0, 4, 0);
  expect_close("target_in", b.top[3]->data, in0, 6, 0);
  expect_close("target_out", b.top[4]->data, out0, 6, 0);
  expect_close("target_cont", b.top[5]->data, tcont0, 6, 0);
  forward(&b); /* "de" -> C C C C, "abc" -> A B C: S = 3, T = 5 */
  for (int t = 0; t < 6; t++) expect_shape(b.top[t], 2, t < 3 ? SHAPE(3, 2) : SHAPE(5, 2));
  const float in1[] = {2, 2, 6, 4, 6, 5, 6, 6, 6, 0};
  const float out1[] = {6, 4, 6, 5, 6, 6, 6, 3, 3, -1};
  const float tcont1[] = {0, 0, 1, 1, 1, 1, 1, 1, 1, 0};
  expect_close("target_in", b.top[3]->data, in1, 10, 0);
  expect_close("target_out", b.top[4]->data, out1, 10, 0);
  expect_close("target_cont", b.top[5]->data, tcont1, 10, 0);
  assert_int_equal(b.l->ops->get_cursor(b.l), 2);
  unbuild(&b);
  /* a target longer than target_len allows (its tokens and </s>): refused by line, or cut to
   * target_len tokens, the last of them no </s> (the target goes on) */
  char text[1024];
  snprintf(text, sizeof text, "name: 't' type: 'TextData' text_data_param { source: '%s/pairs.tsv' "
           "mode: PAIRS batch_size: 2 seq_len: 4 target_len: 4 }", dir);
  expect_fails_ex(text, TRAIN, NULL, 0, 6, false, KILN_ERR_DATA, "layer 't' (TextData)",
                  "pairs.tsv:4: a target of 4 tokens and </s>, longer than "
                  "text_data_param.target_len 4",
                  "truncate: true");
  built t = text_layer("mode: PAIRS batch_size: 4 seq_len: 2 target_len: 3 truncate: true "
                       "pad_label: 9", 6, TRAIN);
  forward(&t); /* c, ab, abc (cut to ab: A B C, all three kept), de (C C C C cut to C C C) */
  expect_shape(t.top[0], 2, SHAPE(2, 4));
  expect_shape(t.top[4], 2, SHAPE(3, 4));
  const float in2[] = {2, 2, 2, 2, 6, 4, 4, 6, 0, 5, 5, 6};
  const float out2[] = {6, 4, 4, 6, 3, 5, 5, 6, 9, 3, 6, 6};
  expect_close("cut target_in", t.top[3]->data, in2, 12, 0);
  expect_close("cut target_out", t.top[4]->data, out2, 12, 0);
  unbuild(&t);
  kiln_vocab_free(v);
}

/* What PAIRS refuses, by file and line: a target vocabulary without <s> or </s>, or without the
 * <pad> it pads with; a line without a tab; a record without source tokens; a target token
 * outside a vocabulary without <unk>; a source that is not .tsv; no target_len. */
static void test_pairs_bad_inputs(void **state) {
  (void)state;
  const char *who = "layer 't' (TextData)";
  kiln_vocab *v = text_file("pairs.tsv", pairs_text, "abcde");
  kiln_vocab_free(v);
  char text[1024];
#define PAIRS(src, extra)                                                                          \
  (snprintf(text, sizeof text, "name: 't' type: 'TextData' text_data_param { source: '%s/%s' "     \
            "vocab: '%s/vocab.txt' mode: PAIRS batch_size: 2 seq_len: 8 target_len: 8 %s }", dir, \
            src, dir, extra),                                                                      \
   text)
  write_file("target_vocab.txt", TARGET_VOCAB);
  write_file("nostart.txt", "# kiln vocabulary: level word, lowercase 0, 6 tokens\n"
                            "<pad>\n<unk>\n</s>\nA\nB\nC\n");
  write_file("noend.txt", "# kiln vocabulary: level word, lowercase 0, 6 tokens\n"
                          "<pad>\n<unk>\n<s>\nA\nB\nC\n");
  write_file("nopad.txt", "# kiln vocabulary: level word, lowercase 0, 5 tokens\n"
                          "<s>\n</s>\nA\nB\nC\n");
  write_file("nounk.txt", "# kiln vocabulary: level word, lowercase 0, 6 tokens\n"
                          "<pad>\n<s>\n</s>\nA\nB\nC\n");
  const struct {
    const char *file, *text, *target_vocab; /* text NULL: pairs.tsv as it is */
    int code;
    const char *want, *want2;
  } bad[] = {
      {"pairs.tsv", NULL, "nostart.txt", KILN_ERR_DATA, "nostart.txt has no <s> token",
       "starts every target_in with <s> and ends every target_out with </s>"},
      {"pairs.tsv", NULL, "noend.txt", KILN_ERR_DATA, "noend.txt has no </s> token", NULL},
      {"pairs.tsv", NULL, "nopad.txt", KILN_ERR_DATA,
       "nopad.txt has no <pad> token, which mode PAIRS pads with", NULL},
      {"pairs.tsv", NULL, "nothere.txt", KILN_ERR_IO, "target_vocab: ", "nothere.txt"},
      {"notab.tsv", "ab\tA B\nabc A B C\n", NULL, KILN_ERR_PARSE,
       "notab.tsv:2: no tab: a line is SOURCE<TAB>TARGET", NULL},
      {"nosource.tsv", "ab\tA B\n\tC\n", NULL, KILN_ERR_DATA,
       "nosource.tsv:2: a record without source tokens", NULL},
      {"unknown.tsv", "ab\tA B\nabc\tA D\n", "nounk.txt", KILN_ERR_DATA,
       "unknown.tsv:2: token 'D' is not in the vocabulary", "nounk.txt"},
      {"pairs.txt", "ab\tA B\n", NULL, KILN_ERR_DATA,
       "pairs.txt: paired records are a .tsv file of SOURCE<TAB>TARGET lines", NULL},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    if (bad[i].text) write_file(bad[i].file, bad[i].text);
    char extra[512] = ""; /* without one, target_vocab.txt beside the source */
    if (bad[i].target_vocab)
      snprintf(extra, sizeof extra, "target_vocab: '%s/%s'", dir, bad[i].target_vocab);
    expect_fails_ex(PAIRS(bad[i].file, extra), TRAIN, NULL, 0, 6, false, bad[i].code, who,
                    bad[i].want, bad[i].want2);
  }
  snprintf(text, sizeof text, "name: 't' type: 'TextData' text_data_param { source: "
           "'%s/pairs.tsv' mode: PAIRS batch_size: 2 seq_len: 8 }", dir);
  expect_create_fails(text, TRAIN, NULL, 0, 6, KILN_ERR_INVALID, who, "target_len must be set");
  /* an empty target is one step: <s> in, </s> out */
  write_file("empty.tsv", "ab\t\n");
  built b = build(PAIRS("empty.tsv", ""), TRAIN, NULL, 0, 6);
  forward(&b);
  expect_shape(b.top[3], 2, SHAPE(1, 1));
  assert_int_equal((int)b.top[3]->data[0], 2);
  assert_int_equal((int)b.top[4]->data[0], 3);
  unbuild(&b);
#undef PAIRS
}

/* The records of a .tsv of pairs: both sides decoded, the target the rest of the line. */
static int collect_pair(void *user, const char *source, size_t slen, const char *target,
                        size_t tlen, int line) {
  char *out = user;
  char rec[128];
  snprintf(rec, sizeof rec, "%d[%.*s|%.*s]", line, (int)slen, source, (int)tlen, target);
  assert_int_equal(strlen(source), slen); /* NUL-terminated */
  assert_int_equal(strlen(target), tlen);
  strcat(out, rec);
  return KILN_OK;
}

static void test_pair_records(void **state) {
  (void)state;
  char path[256], got[512] = "";
  write_file("p.tsv", "a\\tb\tA B\nx\\\\\ty\tz\n");
  assert_int_equal(kiln_text_pairs(in_dir("p.tsv", path, sizeof path), collect_pair, got),
                   KILN_OK);
  assert_string_equal(got, "1[a\tb|A B]2[x\\|y\tz]");
  write_file("bad.tsv", "a\tA\nb\\q\tB\n");
  assert_int_equal(kiln_text_pairs(in_dir("bad.tsv", path, sizeof path), collect_pair, got),
                   KILN_ERR_PARSE);
  expect_message("bad.tsv:2: a backslash", NULL, NULL);
}

/* ---- edit distance ------------------------------------------------------------------------ */

static size_t distance(const char *a, const char *b) {
  int32_t x[32], y[32];
  size_t na = strlen(a), nb = strlen(b);
  for (size_t i = 0; i < na; i++) x[i] = a[i];
  for (size_t i = 0; i < nb; i++) y[i] = b[i];
  size_t d = 99;
  assert_int_equal(kiln_edit_distance(x, na, y, nb, &d), KILN_OK);
  return d;
}

static void test_edit_distance(void **state) {
  (void)state;
  assert_int_equal(distance("", ""), 0);
  assert_int_equal(distance("abc", ""), 3);
  assert_int_equal(distance("", "ab"), 2);
  assert_int_equal(distance("abc", "abc"), 0);
  assert_int_equal(distance("abc", "abd"), 1);      /* a substitution */
  assert_int_equal(distance("abc", "ac"), 1);       /* a deletion */
  assert_int_equal(distance("ac", "abc"), 1);       /* an insertion */
  assert_int_equal(distance("kitten", "sitting"), 3);
  assert_int_equal(distance("sitting", "kitten"), 3); /* symmetric */
  assert_int_equal(distance("abcdef", "badcfe"), 4); /* no transpositions: two edits each */
  assert_int_equal(distance("aaaa", "bbb"), 4);
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
      cmocka_unit_test(test_tagged_bucketed),
      cmocka_unit_test(test_tagged_batches_as_sequences),
      cmocka_unit_test(test_tagged_bad_records),
      cmocka_unit_test(test_pairs_bucketed),
      cmocka_unit_test(test_pairs_bad_inputs),
      cmocka_unit_test(test_pair_records),
      cmocka_unit_test(test_edit_distance),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
