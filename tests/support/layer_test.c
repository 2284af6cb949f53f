/* Helpers for the layer tests (see layer_test.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <string.h>

#include "layer_test.h"

/* ---- blobs ------------------------------------------------------------------------------- */

kiln_blob *blob_of(const char *name, int naxes, const int64_t *shape, const float *values) {
  kiln_blob *b = kiln_blob_new(name);
  assert_non_null(b);
  assert_int_equal(kiln_blob_reshape(b, naxes, shape), KILN_OK);
  if (values) memcpy(b->data, values, sizeof(float) * (size_t)b->count);
  return b;
}

kiln_blob *blob_copy(const char *name, const kiln_blob *src) {
  return blob_of(name, src->naxes, src->shape, src->data);
}

kiln_blob *iota_blob(const char *name, int naxes, const int64_t *shape, float start) {
  kiln_blob *b = blob_of(name, naxes, shape, NULL);
  for (int64_t i = 0; i < b->count; i++) b->data[i] = start + (float)i;
  return b;
}

kiln_blob *distinct_blob(const char *name, int naxes, const int64_t *shape, kiln_rng *rng) {
  kiln_blob *b = blob_of(name, naxes, shape, NULL);
  for (int64_t i = 0; i < b->count; i++) b->data[i] = (float)i * 0.05f - 2.5f;
  for (int64_t i = b->count - 1; i > 0; i--) {
    int64_t j = kiln_rng_below(rng, (uint32_t)(i + 1));
    float t = b->data[i];
    b->data[i] = b->data[j];
    b->data[j] = t;
  }
  return b;
}

kiln_blob *label_blob(const char *name, int naxes, const int64_t *shape, int C, kiln_rng *rng) {
  kiln_blob *b = blob_of(name, naxes, shape, NULL);
  for (int64_t i = 0; i < b->count; i++) b->data[i] = (float)kiln_rng_below(rng, (uint32_t)C);
  return b;
}

/* ---- a layer built outside a net ------------------------------------------------------- */

built build_on(const char *text, int phase, kiln_blob **bottoms, int nbottom, kiln_blob **tops,
               int ntop) {
  built b = {.lp = gc_layer_param(text), .ntop = ntop, .own_tops = tops == NULL};
  assert_true(ntop <= (int)(sizeof b.top / sizeof b.top[0]));
  for (int t = 0; t < ntop; t++) b.top[t] = tops ? tops[t] : kiln_blob_new("top");
  int rc = kiln_layer_create(b.lp, phase, bottoms, nbottom, b.top, ntop, 7, kiln_test_config(), &b.l);
  if (rc != KILN_OK) {
    print_error("cannot create layer: %s: %s\n", kiln_status_name(rc), kiln_last_error());
    fail();
  }
  return b;
}

built build(const char *text, int phase, kiln_blob **bottoms, int nbottom, int ntop) {
  return build_on(text, phase, bottoms, nbottom, NULL, ntop);
}

void unbuild(built *b) {
  kiln_layer_free(b->l);
  if (b->own_tops)
    for (int t = 0; t < b->ntop; t++) kiln_blob_free(b->top[t]);
  protobuf_c_message_free_unpacked(&b->lp->base, NULL);
}

void forward(built *b) {
  int rc = b->l->ops->forward(b->l);
  if (rc != KILN_OK) {
    print_error("forward: %s\n", kiln_last_error());
    fail();
  }
}

void backward(built *b) {
  int rc = b->l->ops->backward(b->l);
  if (rc != KILN_OK) {
    print_error("backward: %s\n", kiln_last_error());
    fail();
  }
}

void set_params(built *b, int p, const float *v) {
  assert_true(p < b->l->nparam);
  memcpy(b->l->param[p]->data, v, sizeof(float) * (size_t)b->l->param[p]->count);
}

/* ---- checks ------------------------------------------------------------------------------ */

void fill(float *x, int64_t n, float v) {
  for (int64_t i = 0; i < n; i++) x[i] = v;
}

void expect_close(const char *what, const float *got, const float *want, int64_t n, double tol) {
  for (int64_t i = 0; i < n; i++)
    if (!(fabs((double)got[i] - (double)want[i]) <= tol * fmax(1.0, fabs((double)want[i])))) {
      print_error("%s[%lld]: got %.9g, want %.9g\n", what, (long long)i, (double)got[i],
                  (double)want[i]);
      fail();
    }
}

void expect_shape(const kiln_blob *b, int naxes, const int64_t *shape) {
  char buf[128];
  bool ok = b->naxes == naxes;
  for (int i = 0; ok && i < naxes; i++) ok = b->shape[i] == shape[i];
  if (!ok) {
    print_error("blob '%s' has shape %s (%d axes)\n", b->name,
                kiln_blob_shape_string(b, buf, sizeof buf), b->naxes);
    fail();
  }
}

void expect_message(const char *a, const char *b, const char *c) {
  const char *m = kiln_last_error();
  const char *parts[3] = {a, b, c};
  for (int i = 0; i < 3; i++)
    if (parts[i] && !strstr(m, parts[i])) {
      print_error("error message '%s' lacks '%s'\n", m, parts[i]);
      fail();
    }
}

void expect_fails_ex(const char *text, int phase, kiln_blob **bottoms, int nbottom, int ntop,
                     bool in_place, int code, const char *who, const char *what,
                     const char *what2) {
  Caffe__LayerParameter *lp = gc_layer_param(text);
  kiln_blob *tops[8];
  assert_true(ntop <= 8);
  for (int t = 0; t < ntop; t++) tops[t] = in_place ? bottoms[0] : kiln_blob_new("top");
  kiln_layer *l = NULL;
  kiln_clear_error();
  int rc = kiln_layer_create(lp, phase, bottoms, nbottom, tops, ntop, 1, kiln_test_config(), &l);
  if (rc != code) {
    print_error("%s: status '%s', want '%s' (%s)\n", text, kiln_status_name(rc),
                kiln_status_name(code), kiln_last_error());
    fail();
  }
  assert_null(l);
  expect_message(who, what, what2);
  if (!in_place)
    for (int t = 0; t < ntop; t++) kiln_blob_free(tops[t]);
  protobuf_c_message_free_unpacked(&lp->base, NULL);
}

void expect_create_fails(const char *text, int phase, kiln_blob **bottoms, int nbottom, int ntop,
                         int code, const char *who, const char *what) {
  expect_fails_ex(text, phase, bottoms, nbottom, ntop, false, code, who, what, NULL);
}

void check_grad(const char *text, kiln_blob **bottoms, int nbottom, int ntop,
                const gradcheck_opts *opts) {
  int failures = gradcheck_layer(text, bottoms, nbottom, ntop, opts);
  if (failures) {
    print_error("%d gradient mismatches for: %s\n", failures, text);
    fail();
  }
}
