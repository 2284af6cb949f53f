/* What the Data and ImageData layers share (data.c): the state of a layer that reads records
 * from a source into an endless stream of positions, transforms them (crop, mirror, mean,
 * scale) on the prefetch thread of a ring of batches (batch_ring.h), deals whole batches to
 * data-parallel workers and resumes from one cursor. A layer fills in its source (the `read` and `name`
 * hooks, the record shape and count), then calls kiln_data_layer_finish; the rest of its table
 * is the functions below. */
#ifndef KILN_DATA_LAYER_H
#define KILN_DATA_LAYER_H

#include "kiln/data.h"
#include "batch_ring.h"
#include "kiln/parallel.h"

/* One database of a mixed stream (Data with several sources). */
typedef struct {
  kiln_datum_db *db;
  char *path;
  uint64_t size;
  kiln_record_order order; /* the records of its own stream positions */
  double upto;             /* a draw u in [0, 1) below this (and above the previous) picks it */
  uint64_t next;           /* its stream position for the next draw that picks it */
} kiln_data_mix_source;

typedef struct kiln_data_state kiln_data_state;
struct kiln_data_state {
  /* The source. read: the record at stream position pos (its index in the source's own order
   * in *index), valid until the next read; called from the prefetch thread only, once the
   * layer is set up. name: a record's name in messages ("list.txt:7 (cat.png)"). */
  int (*read)(kiln_data_state *s, uint64_t pos, kiln_datum *d, uint64_t *index);
  void (*name)(const kiln_data_state *s, uint64_t index, char *buf, size_t n);
  /* Data */
  kiln_datum_db *db; /* the one source; NULL when mixing several */
  char *source;      /* the database's path, $KILN_DATA expanded (the first one's when mixing);
                        ImageData: the list's */
  kiln_data_mix_source *mix; /* nmix > 1 sources, or NULL */
  int nmix;
  uint64_t mix_pos; /* stream positions below this are counted into the sources' next */
  /* ImageData */
  kiln_image_list list;
  char *root;           /* root_folder, joined to each path as it is (Caffe's rule) */
  char *file;           /* root + path of the image being read */
  size_t file_cap;
  kiln_image image;     /* the last image read */
  kiln_image_color color;
  kiln_db_backend backend; /* what data_param asks for (Data only) */
  int new_height, new_width;
  /* the records and the transform */
  int batch, C, H, W, outH, outW, crop;
  float scale;
  float *mean; /* C*H*W from mean_file, or NULL */
  float mean_value[64];
  int n_mean_value;
  bool mirror, train, shuffle;
  int last_batch;
  uint64_t size;            /* records in the source */
  kiln_batch_stream stream; /* batch j -> records; base is the restored cursor */
  kiln_record_order order;  /* the records of stream positions */
  uint64_t seed;
  kiln_batch_ring ring; /* batches of data (top 0) and labels (top 1) */
};

/* Allocates the state as l->priv (freed by kiln_data_layer_destroy whatever happens next). */
int kiln_data_layer_init(kiln_layer *l, kiln_data_state **out);
/* Once the source is open (read, name, C, H, W, size) and batch, shuffle, last_batch and seed
 * are set: the batch stream, the record order, the transform (checked against the records'
 * shape), the prefetch ring's size (counted in l->extra_bytes, allocated at the first
 * forward). */
int kiln_data_layer_finish(kiln_layer *l, kiln_data_state *s,
                           const Caffe__TransformationParameter *t, uint32_t prefetch);
int kiln_data_layer_reshape(kiln_layer *l);
int kiln_data_layer_forward(kiln_layer *l);
uint64_t kiln_data_layer_get_cursor(kiln_layer *l);
int kiln_data_layer_set_cursor(kiln_layer *l, uint64_t cursor);
void kiln_data_layer_destroy(kiln_layer *l);

#endif
