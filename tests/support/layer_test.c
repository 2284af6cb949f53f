/* Helpers for the layer tests (see layer_test.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "device_mirror.h"
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
  int rc =
      kiln_layer_create(b.lp, phase, bottoms, nbottom, b.top, ntop, 7, kiln_test_config(), &b.l);
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
  int rc = layer_forward(b->l);
  if (rc != KILN_OK) {
    print_error("forward: %s\n", kiln_last_error());
    fail();
  }
}

void backward(built *b) {
  int rc = layer_backward(b->l);
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

void expect_in_place_same(const char *text, int phase, kiln_blob **bottoms, int nbottom) {
  kiln_rng rng;
  kiln_rng_seed(&rng, 5, 5);
  kiln_blob *a[4], *b[4];
  for (int i = 0; i < nbottom; i++) {
    a[i] = blob_copy("a", bottoms[i]);
    b[i] = blob_copy("b", bottoms[i]);
  }
  built out = build(text, phase, a, nbottom, 1);
  built in = build_on(text, phase, b, nbottom, &b[0], 1);
  assert_int_equal(out.l->nparam, in.l->nparam);
  for (int p = 0; p < out.l->nparam; p++) {
    set_params(&in, p, out.l->param[p]->data);
    fill(out.l->param[p]->diff, out.l->param[p]->count, 0);
    fill(in.l->param[p]->diff, in.l->param[p]->count, 0);
  }
  forward(&out);
  forward(&in);
  int64_t n = out.top[0]->count;
  expect_close("in-place output", b[0]->data, out.top[0]->data, n, 0);
  for (int64_t i = 0; i < n; i++) out.top[0]->diff[i] = b[0]->diff[i] = kiln_rng_uniform(&rng, -1, 1);
  backward(&out);
  backward(&in);
  for (int i = 0; i < nbottom; i++) expect_close("in-place bottom diff", b[i]->diff, a[i]->diff, a[i]->count, 0);
  for (int p = 0; p < out.l->nparam; p++)
    expect_close("in-place param diff", in.l->param[p]->diff, out.l->param[p]->diff,
                 out.l->param[p]->count, 0);
  unbuild(&out);
  unbuild(&in);
  for (int i = 0; i < nbottom; i++) {
    kiln_blob_free(a[i]);
    kiln_blob_free(b[i]);
  }
}


void expect_rel(const char *what, const float *got, const double *want, int64_t n,
                       double rel) {
  for (int64_t i = 0; i < n; i++)
    if (!(fabs((double)got[i] - want[i]) <= rel * fmax(1e-3, fabs(want[i])))) {
      print_error("%s[%lld]: got %.9g, want %.12g\n", what, (long long)i, (double)got[i],
                  want[i]);
      fail();
    }
}

void expect_in_place_matches(const char *text, const kiln_blob *x, kiln_rng *rng) {
  kiln_blob *a = blob_copy("a", x), *b = blob_copy("b", x);
  built out = build(text, TRAIN, &a, 1, 1);
  built in = build_on(text, TRAIN, &b, 1, &b, 1);
  for (int p = 0; p < out.l->nparam; p++) {
    set_params(&in, p, out.l->param[p]->data);
    fill(out.l->param[p]->diff, out.l->param[p]->count, 0);
    fill(in.l->param[p]->diff, in.l->param[p]->count, 0);
  }
  for (int pass = 0; pass < 2; pass++) {
    if (pass == 1) { /* new input values, same shape */
      for (int64_t i = 0; i < x->count; i++) a->data[i] = kiln_rng_uniform(rng, -2, 2);
      memcpy(b->data, a->data, sizeof(float) * (size_t)x->count);
    }
    forward(&out);
    forward(&in);
    char what[300];
    snprintf(what, sizeof what, "%s: in-place output (pass %d)", text, pass);
    expect_close(what, b->data, out.top[0]->data, x->count, 0);
    for (int64_t i = 0; i < x->count; i++)
      out.top[0]->diff[i] = b->diff[i] = kiln_rng_uniform(rng, -1, 1);
    fill(a->diff, x->count, 1e3f);
    backward(&out);
    backward(&in);
    snprintf(what, sizeof what, "%s: in-place input gradient (pass %d)", text, pass);
    expect_close(what, b->diff, a->diff, x->count, 0);
    for (int p = 0; p < out.l->nparam; p++) {
      snprintf(what, sizeof what, "%s: in-place param %d gradient (pass %d)", text, p, pass);
      expect_close(what, in.l->param[p]->diff, out.l->param[p]->diff, out.l->param[p]->count, 0);
    }
  }
  unbuild(&in);
  unbuild(&out);
  kiln_blob_free(a);
  kiln_blob_free(b);
}

/* ---- in a net ---------------------------------------------------------------------------- */

kiln_net *net_run(const char *text, Caffe__NetParameter **np) {
  if (kiln_net_param_from_text(text, "test.prototxt", np)) {
    print_error("%s\n", kiln_last_error());
    fail();
  }
  kiln_net_options opt = {.phase = TRAIN, .seed = 3, .config = kiln_test_net_config()};
  kiln_net *net;
  if (kiln_net_create(*np, &opt, &net)) {
    print_error("%s\n", kiln_last_error());
    fail();
  }
  kiln_rng rng;
  kiln_rng_seed(&rng, 33, 1);
  kiln_blob *x = kiln_net_blob(net, "x");
  assert_non_null(x);
  for (int64_t i = 0; i < x->count; i++) x->data[i] = kiln_rng_uniform(&rng, -1, 1);
  float loss = 0;
  kiln_net_zero_param_diff(net);
  assert_int_equal(kiln_net_forward(net, &loss), KILN_OK);
  assert_true(isfinite(loss) && loss > 0);
  assert_int_equal(kiln_net_backward(net), KILN_OK);
  return net;
}
