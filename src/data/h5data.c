/* HDF5 data files, the source of Caffe's HDF5Data layer (docs/formats.md, "HDF5 data files"):
 * datasets of numbers whose first axis counts the records, read whole and converted to float;
 * and the files HDF5Output writes. Through Debian's libhdf5, as the snapshots (src/proto/h5.c),
 * and like them read in a child process (src/data/h5data_server.c: a damaged file can crash
 * libhdf5 itself), with these differences:
 *   - a file is inspected (the layer's set-up learns every file's record count and shapes)
 *     through libhdf5's POSIX driver, which reads the metadata alone, once the path is known to
 *     be a regular file: reading every file whole at set-up would cost a pass over the data;
 *   - a file is loaded whole into memory and opened as a file image with callbacks that let
 *     libhdf5 read the image where it lies. H5Pset_file_image alone copies it twice (into the
 *     property list, then into the driver), and a data file may be gigabytes: this way a file
 *     takes its bytes plus its values as floats, which is what the memory allowance counts;
 *   - every in-memory file gets a name of its own: libhdf5 takes two in-memory files of one
 *     name for the same open file (a fuzzing build, which reads in process, may hold several);
 *   - a dataset stored in external files or a virtual dataset is refused: libhdf5 would open
 *     other files by the names inside the file;
 *   - compressed data (chunks through deflate, shuffle and fletcher32, what h5py writes; other
 *     filters are refused) are checked chunk by chunk before libhdf5 reads them: libhdf5 1.10
 *     reads past its own buffer when a chunk inflates to fewer bytes than a chunk holds (found
 *     by fuzz_h5data), so every stored chunk is inflated here first and must give exactly that.
 * libhdf5's error printing is set per thread in its thread-safe build (Debian's): every entry
 * point silences it. */
#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "data/internal.h"
#include "kiln/data.h"
#include "kiln/proto.h"

static void quiet(void) { H5Eset_auto2(H5E_DEFAULT, NULL, NULL); }

/* A name no other in-memory file of this process has. */
static void image_name(char *buf, size_t n) {
  static atomic_ulong next;
  snprintf(buf, n, "kiln-h5data-%lu.h5", (unsigned long)atomic_fetch_add(&next, 1));
}

static const char *bytes_text(uint64_t b, char *buf, size_t n) {
  if (b >= (1ull << 30)) snprintf(buf, n, "%.1f GiB", (double)b / 1073741824.0);
  else if (b >= (1ull << 20)) snprintf(buf, n, "%.1f MiB", (double)b / 1048576.0);
  else if (b >= 1024) snprintf(buf, n, "%.1f KiB", (double)b / 1024.0);
  else snprintf(buf, n, "%llu bytes", (unsigned long long)b);
  return buf;
}

/* The file's bytes and its values as floats against the allowance (0: none). */
static int check_allowance(const char *name, uint64_t bytes, uint64_t floats, uint64_t limit) {
  const double need = (double)bytes + 4.0 * (double)floats;
  if (!limit || need <= (double)limit) return KILN_OK;
  char a[32], b[32], c[32];
  if (!floats)
    return kiln_errorf(KILN_ERR_NOMEM,
                       "%s: the file's %s are over the memory allowance of %s per HDF5 data file "
                       "(KILN_HDF5_FILE_LIMIT; by default a quarter of the memory available); "
                       "split it into smaller files",
                       name, bytes_text(bytes, a, sizeof a), bytes_text(limit, c, sizeof c));
  return kiln_errorf(KILN_ERR_NOMEM,
                     "%s: loading it takes %s (the file's %s and its %llu values as floats), over "
                     "the memory allowance of %s per HDF5 data file (KILN_HDF5_FILE_LIMIT; by "
                     "default a quarter of the memory available); split it into smaller files",
                     name, bytes_text((uint64_t)need, a, sizeof a), bytes_text(bytes, b, sizeof b),
                     (unsigned long long)floats, bytes_text(limit, c, sizeof c));
}

int64_t kiln_h5data_record_size(const kiln_h5data_shape *s) {
  int64_t n = 1;
  for (int i = 1; i < s->naxes; i++) n *= s->dims[i];
  return n;
}

/* ---- reading ------------------------------------------------------------------------------- */

/* An open file: its name for messages and its length, which stored data must lie within. */
typedef struct {
  const char *name;
  hid_t file;
  uint64_t len;
} source;

/* Callbacks that hand libhdf5 the caller's image instead of copies of it (read-only: it is
 * never written, grown or freed through them). */
typedef struct {
  void *image;
  size_t len;
} image_ref;

static void *image_malloc(size_t size, H5FD_file_image_op_t op, void *udata) {
  (void)op;
  const image_ref *r = udata;
  return size == r->len ? r->image : NULL;
}

static void *image_memcpy(void *dest, const void *src, size_t size, H5FD_file_image_op_t op,
                          void *udata) {
  (void)op, (void)udata;
  if (dest != src) memmove(dest, src, size); /* never: every buffer is the image itself */
  return dest;
}

static void *image_realloc(void *ptr, size_t size, H5FD_file_image_op_t op, void *udata) {
  (void)ptr, (void)size, (void)op, (void)udata;
  return NULL;
}

static herr_t image_free(void *ptr, H5FD_file_image_op_t op, void *udata) {
  (void)ptr, (void)op, (void)udata;
  return 0;
}

static void *udata_copy(void *udata) { return udata; }
static herr_t udata_free(void *udata) {
  (void)udata;
  return 0;
}

static const char signature[8] = "\x89HDF\r\n\x1a\n";

/* libhdf5 looks for its signature at 0, 512, 1024, 2048, ... (after a user block). */
static bool image_has_signature(const unsigned char *image, size_t len) {
  for (size_t at = 0; at + 8 <= len; at = at ? 2 * at : 512)
    if (!memcmp(image + at, signature, 8)) return true;
  return false;
}

static bool file_has_signature(int fd, uint64_t len) {
  char buf[8];
  for (uint64_t at = 0; at + 8 <= len; at = at ? 2 * at : 512)
    if (pread(fd, buf, 8, (off_t)at) == 8 && !memcmp(buf, signature, 8)) return true;
  return false;
}

static int open_image(source *f, image_ref *ref, const void *image, size_t len, const char *name) {
  quiet();
  f->name = name;
  f->file = -1;
  f->len = len;
  if (!image_has_signature(image, len))
    return kiln_errorf(KILN_ERR_PARSE, "%s: not an HDF5 file (no HDF5 signature)", name);
  ref->image = (void *)image; /* only read: the file is opened read-only */
  ref->len = len;
  H5FD_file_image_callbacks_t cb = {image_malloc, image_memcpy, image_realloc, image_free,
                                    udata_copy,   udata_free,   ref};
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  if (fapl >= 0 && H5Pset_fapl_core(fapl, 1 << 20, 0) >= 0 &&
      H5Pset_file_image_callbacks(fapl, &cb) >= 0 &&
      H5Pset_file_image(fapl, (void *)image, len) >= 0) {
    char in_memory[64];
    image_name(in_memory, sizeof in_memory);
    f->file = H5Fopen(in_memory, H5F_ACC_RDONLY, fapl);
  }
  if (fapl >= 0) H5Pclose(fapl);
  if (f->file < 0)
    return kiln_errorf(KILN_ERR_PARSE, "%s: not a readable HDF5 file (corrupt or truncated)", name);
  return KILN_OK;
}

/* Opens a regular file with libhdf5's POSIX driver (metadata read on demand). */
static int open_path(source *f, const char *path) {
  quiet();
  f->name = path;
  f->file = -1;
  /* O_NONBLOCK: a FIFO must not hang the open; it is refused just after. */
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return kiln_errorf(KILN_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return kiln_errorf(KILN_ERR_IO, "%s: not a regular file", path);
  }
  f->len = (uint64_t)st.st_size;
  bool hdf5 = file_has_signature(fd, f->len);
  close(fd);
  if (!hdf5) return kiln_errorf(KILN_ERR_PARSE, "%s: not an HDF5 file (no HDF5 signature)", path);
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  /* lock where the file system can (a shared lock: read-only), go on where it cannot */
  if (fapl >= 0 && H5Pset_fapl_sec2(fapl) >= 0 && H5Pset_file_locking(fapl, 1, 1) >= 0)
    f->file = H5Fopen(path, H5F_ACC_RDONLY, fapl);
  if (fapl >= 0) H5Pclose(fapl);
  if (f->file < 0)
    return kiln_errorf(KILN_ERR_PARSE, "%s: not a readable HDF5 file (corrupt or truncated)", path);
  return KILN_OK;
}

static const char *class_name(H5T_class_t c) {
  switch (c) {
    case H5T_STRING: return "strings";
    case H5T_COMPOUND: return "compound records";
    case H5T_ENUM: return "enumerated values";
    case H5T_ARRAY: return "arrays";
    case H5T_VLEN: return "variable-length sequences";
    case H5T_REFERENCE: return "references";
    case H5T_OPAQUE: return "opaque bytes";
    case H5T_BITFIELD: return "bit fields";
    case H5T_TIME: return "times";
    default: return "values of an unknown class";
  }
}

/* A compressed dataset may hold more values than its file has bytes; beyond this ratio (plus
 * 1 MiB) a claim is taken for damage, so that a small file cannot make libhdf5 fill gigabytes. */
#define H5DATA_MAX_EXPANSION 1024

/* Dataset `name`: its shape and element count after the checks; *d stays open for reading. */
static int check_dataset(const source *f, const char *name, kiln_h5data_shape *shape,
                         uint64_t *count, hid_t *d) {
  *d = -1;
  if (!name || !name[0])
    return kiln_errorf(KILN_ERR_INVALID, "%s: a dataset name is empty", f->name);
  /* In the root group, as Caffe finds them (H5LTfind_dataset); and a link of the file's own: a
   * soft or external link would send libhdf5 elsewhere, into other files by name. */
  H5L_info_t link;
  if (strchr(name, '/') || H5Lexists(f->file, name, H5P_DEFAULT) <= 0 ||
      H5Lget_info(f->file, name, &link, H5P_DEFAULT) < 0)
    return kiln_errorf(KILN_ERR_DATA, "%s: no dataset '%s'", f->name, name);
  if (link.type != H5L_TYPE_HARD)
    return kiln_errorf(KILN_ERR_DATA, "%s: '%s' is a %s link, not a dataset of the file", f->name,
                       name, link.type == H5L_TYPE_SOFT ? "soft" : "external");
  *d = H5Dopen2(f->file, name, H5P_DEFAULT);
  if (*d < 0) return kiln_errorf(KILN_ERR_DATA, "%s: '%s' is not a dataset", f->name, name);
  int rc = KILN_OK;
  hid_t space = H5Dget_space(*d);
  H5S_class_t sc = space < 0 ? H5S_NO_CLASS : H5Sget_simple_extent_type(space);
  int rank = sc == H5S_SIMPLE ? H5Sget_simple_extent_ndims(space) : -1;
  hsize_t dims[H5S_MAX_RANK];
  if (sc == H5S_SCALAR || sc == H5S_NULL)
    rc = kiln_errorf(KILN_ERR_DATA, "%s: dataset '%s' holds %s, not records (its first axis "
                     "counts them)", f->name, name,
                     sc == H5S_SCALAR ? "a single value" : "nothing");
  else if (rank < 0 || H5Sget_simple_extent_dims(space, dims, NULL) < 0)
    rc = kiln_errorf(KILN_ERR_PARSE, "%s: dataset '%s': its shape cannot be read", f->name, name);
  else if (rank < 1 || rank > KILN_MAX_AXES)
    rc = kiln_errorf(KILN_ERR_DATA, "%s: dataset '%s' has %d axes; 1 to %d are read", f->name,
                     name, rank, KILN_MAX_AXES);
  if (space >= 0) H5Sclose(space);
  if (rc) return rc;
  if (dims[0] == 0)
    return kiln_errorf(KILN_ERR_DATA, "%s: dataset '%s' holds no records (its first axis is 0)",
                       f->name, name);
  uint64_t n = 1;
  for (int i = 0; i < rank; i++) {
    if (dims[i] == 0)
      return kiln_errorf(KILN_ERR_DATA, "%s: dataset '%s' has records of no values (axis %d is 0)",
                         f->name, name, i);
    if (__builtin_mul_overflow(n, (uint64_t)dims[i], &n) || n > ((uint64_t)1 << 60))
      return kiln_errorf(KILN_ERR_DATA, "%s: dataset '%s' claims more than 2^60 values", f->name,
                         name);
  }
  shape->naxes = rank;
  for (int i = 0; i < rank; i++) shape->dims[i] = (int64_t)dims[i];
  *count = n;

  /* Numbers of at most 8 bytes: libhdf5 converts through buffers sized by the element size,
   * which a damaged file may declare in gigabytes. */
  hid_t ft = H5Dget_type(*d);
  H5T_class_t cls = ft < 0 ? H5T_NO_CLASS : H5Tget_class(ft);
  size_t fsize = ft < 0 ? 0 : H5Tget_size(ft);
  if (ft >= 0) H5Tclose(ft);
  if (cls != H5T_INTEGER && cls != H5T_FLOAT)
    return kiln_errorf(KILN_ERR_DATA, "%s: dataset '%s' holds %s, not numbers", f->name, name,
                       class_name(cls));
  if (fsize == 0 || fsize > 8)
    return kiln_errorf(KILN_ERR_DATA, "%s: dataset '%s' holds numbers of %zu bytes; at most 8",
                       f->name, name, fsize);

  hid_t dcpl = H5Dget_create_plist(*d);
  H5D_layout_t layout = dcpl < 0 ? H5D_LAYOUT_ERROR : H5Pget_layout(dcpl);
  int external = dcpl < 0 ? -1 : H5Pget_external_count(dcpl);
  if (dcpl >= 0) H5Pclose(dcpl);
  if (external != 0 || (layout != H5D_COMPACT && layout != H5D_CONTIGUOUS && layout != H5D_CHUNKED))
    return kiln_errorf(KILN_ERR_DATA, "%s: dataset '%s' is %s; its values must be stored in the "
                       "file itself", f->name, name,
                       external > 0 ? "stored in external files"
                       : layout == H5D_VIRTUAL ? "a virtual dataset (made of other files' data)"
                                               : "of an unknown storage layout");
  const double need = (double)n * (double)fsize, len = (double)f->len;
  if (layout == H5D_CHUNKED) {
    hid_t cp = H5Dget_create_plist(*d);
    int nf = cp < 0 ? -1 : H5Pget_nfilters(cp);
    bool deflated = false; /* in the order the filters were applied when writing */
    for (int i = 0; i < nf; i++) {
      unsigned flags, config;
      size_t nvalues = 0;
      char filter[64] = "";
      const H5Z_filter_t id = H5Pget_filter2(cp, (unsigned)i, &flags, &nvalues, NULL,
                                             sizeof filter, filter, &config);
      /* deflate once, followed by fletcher32 alone (h5py's shuffle, deflate, fletcher32): the
       * arrangements whose chunks check_chunks can follow */
      if ((id == H5Z_FILTER_DEFLATE || id == H5Z_FILTER_SHUFFLE) && deflated) {
        H5Pclose(cp);
        return kiln_errorf(KILN_ERR_UNSUPPORTED,
                           "%s: dataset '%s' applies %s after deflate; kiln reads deflate once, "
                           "followed by fletcher32 alone", f->name, name,
                           id == H5Z_FILTER_DEFLATE ? "deflate again" : "shuffle");
      }
      deflated |= id == H5Z_FILTER_DEFLATE;
      if (id != H5Z_FILTER_DEFLATE && id != H5Z_FILTER_SHUFFLE && id != H5Z_FILTER_FLETCHER32) {
        H5Pclose(cp);
        filter[sizeof filter - 1] = '\0';
        return kiln_errorf(KILN_ERR_UNSUPPORTED,
                           "%s: dataset '%s' is stored through HDF5 filter %d (%s); kiln reads "
                           "data compressed with deflate (gzip), shuffle and fletcher32 only",
                           f->name, name, (int)id, filter[0] ? filter : "unnamed");
      }
    }
    if (cp >= 0) H5Pclose(cp);
    if (nf < 0 || nf > 32)
      return kiln_errorf(KILN_ERR_PARSE, "%s: dataset '%s': its filters cannot be read", f->name,
                         name);
    if (need > len * H5DATA_MAX_EXPANSION + (1 << 20))
      return kiln_errorf(KILN_ERR_DATA, "%s: dataset '%s' claims %llu values, more than a file "
                         "of %llu bytes holds", f->name, name, (unsigned long long)n,
                         (unsigned long long)f->len);
    return KILN_OK;
  }
  /* Compact and contiguous data must be there in full: libhdf5 copies a contiguous dataset's
   * bytes from where the file says they are without checking that against the file's end. */
  const haddr_t at = layout == H5D_CONTIGUOUS ? H5Dget_offset(*d) : 0;
  const bool outside = layout == H5D_CONTIGUOUS && (at == HADDR_UNDEF || (double)at + need > len);
  if ((double)H5Dget_storage_size(*d) < need || outside)
    return kiln_errorf(KILN_ERR_DATA, "%s: dataset '%s' is cut short: its %llu values lie past "
                       "the end of the file (truncated or damaged)", f->name, name,
                       (unsigned long long)n);
  return KILN_OK;
}

/* Every dataset of names[0 .. n) checked (and left open in d[], when d is not NULL); all hold
 * one row per record; the file and its values within the allowance. */
static int examine(const source *f, int n, const char *const *names, uint64_t limit,
                   kiln_h5data_shape *shapes, uint64_t *counts, hid_t *d) {
  if (n < 1 || n > KILN_H5DATA_MAX_SETS)
    return kiln_errorf(KILN_ERR_INVALID, "%s: %d datasets asked for; 1 to %d are read", f->name, n,
                       KILN_H5DATA_MAX_SETS);
  uint64_t floats = 0;
  int rc = KILN_OK;
  for (int i = 0; i < n && !rc; i++) {
    hid_t one;
    rc = check_dataset(f, names[i], &shapes[i], &counts[i], &one);
    if (d) d[i] = one;
    else if (one >= 0) H5Dclose(one);
    if (rc) break;
    if (shapes[i].dims[0] != shapes[0].dims[0])
      rc = kiln_errorf(KILN_ERR_DATA,
                       "%s: dataset '%s' holds %lld records (its first axis), dataset '%s' %lld: "
                       "every dataset of a file holds one row per record",
                       f->name, names[i], (long long)shapes[i].dims[0], names[0],
                       (long long)shapes[0].dims[0]);
    floats += counts[i];
  }
  if (!rc) rc = check_allowance(f->name, f->len, floats, limit);
  return rc;
}

/* ---- the readers proper, in this process (src/data/h5data_server.c runs them in a child) ---- */

int kiln_h5data_inspect_here(const char *path, int n, const char *const *names, uint64_t limit,
                        kiln_h5data_shape *shapes, uint64_t *bytes) {
  source f;
  KILN_TRY(open_path(&f, path));
  uint64_t counts[KILN_H5DATA_MAX_SETS];
  int rc = examine(&f, n, names, limit, shapes, counts, NULL);
  if (bytes) *bytes = f.len;
  H5Fclose(f.file);
  return rc;
}

int kiln_h5data_inspect_image(const void *image, size_t len, const char *name, int n,
                              const char *const *names, uint64_t limit,
                              kiln_h5data_shape *shapes) {
  source f;
  image_ref ref;
  KILN_TRY(open_image(&f, &ref, image, len, name));
  uint64_t counts[KILN_H5DATA_MAX_SETS];
  int rc = examine(&f, n, names, limit, shapes, counts, NULL);
  H5Fclose(f.file);
  return rc;
}

/* A value beyond float's range (a double of 1e300) would become infinity or float's largest
 * value: neither is the number in the file. */
static H5T_conv_ret_t conv_except(H5T_conv_except_t kind, hid_t src, hid_t dst, void *from,
                                  void *to, void *user) {
  (void)src, (void)dst, (void)from, (void)to;
  if (kind != H5T_CONV_EXCEPT_RANGE_HI && kind != H5T_CONV_EXCEPT_RANGE_LOW)
    return H5T_CONV_UNHANDLED; /* rounding, NaN and infinities: as converted (checked after) */
  *(bool *)user = true;
  return H5T_CONV_ABORT;
}

/* The bytes a deflate stream inflates to, counted through a small buffer (nothing is kept), or
 * -1 for a damaged stream or one that ends without its end; counting stops past `most`. */
static int64_t inflated_size(const uint8_t *in, size_t len, uint64_t most) {
  z_stream z;
  memset(&z, 0, sizeof z);
  if (len > UINT32_MAX || inflateInit(&z) != Z_OK) return -1;
  z.next_in = (Bytef *)in;
  z.avail_in = (uInt)len;
  uint8_t scratch[1 << 14];
  int64_t total = 0;
  for (;;) {
    z.next_out = scratch;
    z.avail_out = sizeof scratch;
    const int status = inflate(&z, Z_NO_FLUSH);
    if (status != Z_OK && status != Z_STREAM_END) {
      total = -1; /* damaged, or the input ran out before the stream's end */
      break;
    }
    total += (int64_t)(sizeof scratch - z.avail_out);
    if (status == Z_STREAM_END || (uint64_t)total > most) break;
  }
  inflateEnd(&z);
  return total;
}

/* Every stored chunk of a chunked dataset lies inside the file and, through its filters in
 * reverse (fletcher32 takes 4 bytes off, deflate inflates, shuffle keeps the size), gives exactly
 * the chunk's bytes. libhdf5 1.10 copies a whole chunk out of whatever its filters returned, so a
 * chunk that inflates short has it read past its buffer. The inflated bytes are counted, not
 * kept: the check takes a chunk's stored bytes and 16 KiB, whatever a chunk declares. */
static int check_chunks(const source *f, hid_t d, const char *name, const kiln_h5data_shape *s) {
  hid_t cp = H5Dget_create_plist(d);
  hsize_t cdims[H5S_MAX_RANK];
  const int crank = cp < 0 ? -1 : H5Pget_chunk(cp, H5S_MAX_RANK, cdims);
  const int nf = cp < 0 ? -1 : H5Pget_nfilters(cp);
  H5Z_filter_t ids[32];
  for (int i = 0; i < nf && i < 32; i++) {
    unsigned flags, config;
    size_t nvalues = 0;
    ids[i] = H5Pget_filter2(cp, (unsigned)i, &flags, &nvalues, NULL, 0, NULL, &config);
  }
  if (cp >= 0) H5Pclose(cp);
  hid_t ft = H5Dget_type(d);
  const size_t fsize = ft < 0 ? 0 : H5Tget_size(ft);
  if (ft >= 0) H5Tclose(ft);
  /* the chunk's bytes, and how many chunks the dataset's grid has */
  double chunk = (double)fsize, grid = 1;
  for (int i = 0; i < crank; i++) {
    chunk *= (double)cdims[i];
    if (cdims[i]) grid *= ceil((double)s->dims[i] / (double)cdims[i]);
  }
  hsize_t nchunks = 0;
  hid_t space = H5Dget_space(d); /* libhdf5 1.10.8 takes no H5S_ALL here */
  if (space < 0 || crank != s->naxes || nf < 0 || nf > 32 || chunk < 1 ||
      chunk > (double)((uint64_t)1 << 32) || H5Dget_num_chunks(d, space, &nchunks) < 0 ||
      (double)nchunks > grid) {
    if (space >= 0) H5Sclose(space);
    return kiln_errorf(KILN_ERR_PARSE, "%s: dataset '%s': its chunks are damaged", f->name, name);
  }
  const uint64_t chunk_bytes = (uint64_t)chunk;
  uint8_t *raw = NULL;
  int rc = KILN_OK;
  for (hsize_t c = 0; c < nchunks && !rc; c++) {
    hsize_t offset[H5S_MAX_RANK];
    unsigned mask = 0;
    haddr_t addr = HADDR_UNDEF;
    hsize_t size = 0;
    if (H5Dget_chunk_info(d, space, c, offset, &mask, &addr, &size) < 0 || addr == HADDR_UNDEF ||
        (double)addr + (double)size > (double)f->len || (nf == 0 && size != chunk_bytes)) {
      rc = kiln_errorf(KILN_ERR_PARSE, "%s: dataset '%s': chunk %llu lies past the end of the "
                       "file or is damaged", f->name, name, (unsigned long long)c);
      break;
    }
    if (nf == 0) continue;
    uint8_t *r = realloc(raw, size ? (size_t)size : 1); /* within the file's bytes */
    uint32_t filters = 0;
    if (!r) {
      rc = kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory", f->name);
      break;
    }
    raw = r;
    if (H5Dread_chunk(d, H5P_DEFAULT, offset, &filters, raw) < 0) {
      rc = kiln_errorf(KILN_ERR_PARSE, "%s: dataset '%s': chunk %llu cannot be read", f->name,
                       name, (unsigned long long)c);
      break;
    }
    /* In reverse: fletcher32 before deflate only drops the checksum at the end, so deflate
     * reads the stored bytes from the start (check_dataset allows no other arrangement). */
    int64_t len = (int64_t)size;
    for (int i = nf - 1; i >= 0 && len >= 0; i--) {
      if (filters & (1u << i)) continue; /* skipped for this chunk when it was written */
      if (ids[i] == H5Z_FILTER_FLETCHER32) len = len >= 4 ? len - 4 : -1;
      else if (ids[i] == H5Z_FILTER_DEFLATE)
        len = inflated_size(raw, (size_t)len, chunk_bytes + 4 * (uint64_t)nf);
    }
    if (len != (int64_t)chunk_bytes)
      rc = kiln_errorf(KILN_ERR_PARSE, "%s: dataset '%s': chunk %llu decompresses to %s, not the "
                       "chunk's %llu bytes (damaged)", f->name, name, (unsigned long long)c,
                       len < 0 ? "nothing readable" : "another size",
                       (unsigned long long)chunk_bytes);
  }
  H5Sclose(space);
  free(raw);
  return rc;
}

static int read_dataset(const source *f, hid_t d, const char *name, const kiln_h5data_shape *s,
                        uint64_t count, float *dst) {
  hid_t cp = H5Dget_create_plist(d);
  const bool chunked = cp >= 0 && H5Pget_layout(cp) == H5D_CHUNKED;
  if (cp >= 0) H5Pclose(cp);
  if (chunked) KILN_TRY(check_chunks(f, d, name, s));
  bool out_of_range = false;
  hid_t dxpl = H5Pcreate(H5P_DATASET_XFER);
  herr_t e = dxpl < 0 || H5Pset_type_conv_cb(dxpl, conv_except, &out_of_range) < 0
                 ? -1
                 : H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, dxpl, dst);
  if (dxpl >= 0) H5Pclose(dxpl);
  if (e < 0)
    return out_of_range
               ? kiln_errorf(KILN_ERR_NUMERIC, "%s: dataset '%s' holds a value beyond the range "
                             "of float (about 3.4e38)", f->name, name)
               : kiln_errorf(KILN_ERR_PARSE, "%s: dataset '%s' cannot be read (damaged, or "
                             "compressed with a filter libhdf5 lacks)", f->name, name);
  const uint64_t per = (uint64_t)kiln_h5data_record_size(s);
  for (uint64_t i = 0; i < count; i++)
    if (!isfinite(dst[i]))
      return kiln_errorf(KILN_ERR_NUMERIC, "%s: dataset '%s', record %llu: value %llu is %g; the "
                         "values must be finite", f->name, name, (unsigned long long)(i / per),
                         (unsigned long long)(i % per), (double)dst[i]);
  return KILN_OK;
}

int kiln_h5data_load_image(const void *image, size_t len, const char *name, int n,
                           const char *const *names, uint64_t limit, kiln_h5data_shape *shapes,
                           float *const *dst, const uint64_t *room) {
  source f;
  image_ref ref;
  KILN_TRY(open_image(&f, &ref, image, len, name));
  hid_t d[KILN_H5DATA_MAX_SETS];
  uint64_t counts[KILN_H5DATA_MAX_SETS];
  for (int i = 0; i < KILN_H5DATA_MAX_SETS; i++) d[i] = -1;
  int rc = examine(&f, n, names, limit, shapes, counts, d);
  for (int i = 0; !rc && i < n; i++) {
    if (counts[i] > room[i])
      rc = kiln_errorf(KILN_ERR_DATA, "%s: dataset '%s' holds %llu values, more than the %llu "
                       "there is room for (the file changed since it was first read?)", name,
                       names[i], (unsigned long long)counts[i], (unsigned long long)room[i]);
    else rc = read_dataset(&f, d[i], names[i], &shapes[i], counts[i], dst[i]);
  }
  for (int i = 0; i < n && i < KILN_H5DATA_MAX_SETS; i++)
    if (d[i] >= 0) H5Dclose(d[i]);
  H5Fclose(f.file);
  return rc;
}

/* Loads the file's values: into dst[i] (room[i] values each), or, with dst NULL, into buffers
 * of the sizes the file needs, allocated into own[] (a reader worker's, freed as it ends). */
int kiln_h5data_load_here(const char *path, int n, const char *const *names, uint64_t limit,
                     kiln_h5data_shape *shapes, float *const *dst, const uint64_t *room,
                     float **own) {
  /* the file alone may be over the allowance: refused before it is read */
  struct stat st;
  if (stat(path, &st) == 0 && S_ISREG(st.st_mode))
    KILN_TRY(check_allowance(path, (uint64_t)st.st_size, 0, limit));
  /* A regular file is mapped, not read: its pages come from the page cache as libhdf5 reads
   * them, with no copy into fresh memory, which on a small machine is CPU taken from training
   * at every file. (A file cut short while mapped ends a worker with SIGBUS, which the caller
   * reports as a damaged file.) Anything else, and every error's wording, is kiln_read_file's. */
  char *bytes = NULL;
  size_t len = 0;
  bool mapped = false;
  const int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd >= 0) {
    struct stat fst;
    if (fstat(fd, &fst) == 0 && S_ISREG(fst.st_mode) && fst.st_size > 0) {
      void *map = mmap(NULL, (size_t)fst.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
      if (map != MAP_FAILED) {
        bytes = map;
        len = (size_t)fst.st_size;
        mapped = true;
      }
    }
    close(fd);
  }
  if (!mapped) KILN_TRY(kiln_read_file(path, &bytes, &len));
  int rc = KILN_OK;
  uint64_t counts[KILN_H5DATA_MAX_SETS];
  if (!dst) {
    rc = kiln_h5data_inspect_image(bytes, len, path, n, names, limit, shapes);
    for (int i = 0; i < n && !rc; i++) {
      counts[i] = (uint64_t)shapes[i].dims[0] * (uint64_t)kiln_h5data_record_size(&shapes[i]);
      if (counts[i] > room[i])
        rc = kiln_errorf(KILN_ERR_DATA, "%s: dataset '%s' holds %llu values, more than the %llu "
                         "there is room for (the file changed since it was first read?)", path,
                         names[i], (unsigned long long)counts[i], (unsigned long long)room[i]);
      else if (!(own[i] = malloc(sizeof(float) * (size_t)(counts[i] ? counts[i] : 1))))
        rc = kiln_errorf(KILN_ERR_NOMEM, "%s: out of memory for dataset '%s'", path, names[i]);
    }
    dst = own;
    room = counts;
  }
  if (!rc) rc = kiln_h5data_load_image(bytes, len, path, n, names, limit, shapes, dst, room);
  if (mapped) munmap(bytes, len);
  else free(bytes);
  return rc;
}

int kiln_h5data_sample(const char *path, int samples, kiln_sha256_ctx *h) {
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return kiln_errorf(KILN_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return kiln_errorf(KILN_ERR_IO, "%s: not a regular file", path);
  }
  const uint64_t size = (uint64_t)st.st_size;
  uint8_t le[8];
  for (int i = 0; i < 8; i++) le[i] = (uint8_t)(size >> (8 * i));
  kiln_sha256_update(h, le, sizeof le);
  enum { RUN = 64 };
  for (int s = 0; s < samples; s++) {
    /* evenly spread, the first at the start and the last at the end */
    uint64_t at =
        size <= RUN || samples < 2 ? 0 : (size - RUN) / (uint64_t)(samples - 1) * (uint64_t)s;
    if (s == samples - 1 && size > RUN) at = size - RUN;
    uint8_t buf[RUN];
    ssize_t got = pread(fd, buf, RUN, (off_t)at);
    if (got < 0 || (uint64_t)got < (size < RUN ? size : RUN)) {
      close(fd);
      return kiln_errorf(KILN_ERR_IO, "%s: cannot read byte %llu: %s", path,
                         (unsigned long long)at, got < 0 ? strerror(errno) : "the file shrank");
    }
    kiln_sha256_update(h, buf, (size_t)got);
  }
  close(fd);
  return KILN_OK;
}

/* ---- writing ------------------------------------------------------------------------------- */

int kiln_h5data_write(const char *path, int n, const char *const *names,
                      const kiln_h5data_shape *shapes, const float *const *data) {
  kiln_h5_lock(); /* libhdf5 in this process: no reader child may be forked meanwhile */
  quiet();
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  hid_t file = -1;
  if (fapl >= 0 && H5Pset_fapl_core(fapl, 1 << 20, 0) >= 0) {
    char in_memory[64];
    image_name(in_memory, sizeof in_memory);
    file = H5Fcreate(in_memory, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
  }
  if (fapl >= 0) H5Pclose(fapl);
  if (file < 0) {
    kiln_h5_unlock();
    return kiln_errorf(KILN_ERR_IO, "%s: cannot make an HDF5 file in memory", path);
  }
  int rc = KILN_OK;
  for (int i = 0; i < n && !rc; i++) {
    hsize_t dims[KILN_MAX_AXES];
    for (int k = 0; k < shapes[i].naxes; k++) dims[k] = (hsize_t)shapes[i].dims[k];
    hid_t space = H5Screate_simple(shapes[i].naxes, dims, NULL);
    /* little-endian IEEE floats, as Caffe's files hold them, whatever the machine */
    hid_t d = space < 0 ? -1 : H5Dcreate2(file, names[i], H5T_IEEE_F32LE, space, H5P_DEFAULT,
                                          H5P_DEFAULT, H5P_DEFAULT);
    if (d < 0 || H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data[i]) < 0)
      rc = kiln_errorf(KILN_ERR_IO, "%s: cannot write dataset '%s' (HDF5)", path, names[i]);
    if (d >= 0) H5Dclose(d);
    if (space >= 0) H5Sclose(space);
  }
  ssize_t size = rc || H5Fflush(file, H5F_SCOPE_GLOBAL) < 0 ? -1 : H5Fget_file_image(file, NULL, 0);
  void *image = size > 0 ? malloc((size_t)size) : NULL;
  if (!rc && (!image || H5Fget_file_image(file, image, (size_t)size) != size))
    rc = kiln_errorf(KILN_ERR_IO, "%s: cannot take the HDF5 file's image (%zd bytes)", path, size);
  H5Fclose(file);
  kiln_h5_unlock();
  if (!rc) rc = kiln_write_file_atomic(path, image, (size_t)size);
  free(image);
  return rc;
}
