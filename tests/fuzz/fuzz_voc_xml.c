/* The PASCAL VOC annotation reader (libxml2 behind kiln's error capture, DOCTYPE refusal and
 * checks) and the label map reader. The first byte picks: bit 0 set, the rest is a label map
 * (text format), whose lookups must then find every item by its name and by its label; else
 * the rest is an annotation read against VOC's label map, which on success must hold at least
 * one object, each box inside the image (0 <= min <= max <= 1) with its instance_id counted
 * within its label. */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "kiln/data.h"

static const char voc_map[] =
    "item { name: \"none_of_the_above\" label: 0 display_name: \"background\" }\n"
    "item { name: \"aeroplane\" label: 1 } item { name: \"bicycle\" label: 2 }\n"
    "item { name: \"bird\" label: 3 } item { name: \"boat\" label: 4 }\n"
    "item { name: \"bottle\" label: 5 } item { name: \"bus\" label: 6 }\n"
    "item { name: \"car\" label: 7 } item { name: \"cat\" label: 8 }\n"
    "item { name: \"chair\" label: 9 } item { name: \"cow\" label: 10 }\n"
    "item { name: \"diningtable\" label: 11 } item { name: \"dog\" label: 12 }\n"
    "item { name: \"horse\" label: 13 } item { name: \"motorbike\" label: 14 }\n"
    "item { name: \"person\" label: 15 } item { name: \"pottedplant\" label: 16 }\n"
    "item { name: \"sheep\" label: 17 } item { name: \"sofa\" label: 18 }\n"
    "item { name: \"train\" label: 19 } item { name: \"tvmonitor\" label: 20 }\n";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  const char *text = (const char *)data + 1;
  const size_t len = size - 1;
  if (data[0] & 1) {
    kiln_labelmap m;
    if (kiln_labelmap_parse(text, len, "fuzz.prototxt", &m) == KILN_OK) {
      if (m.n == 0) abort();
      for (size_t i = 0; i < m.n; i++)
        if (kiln_labelmap_find_name(&m, m.name[i]) != (int)i ||
            kiln_labelmap_find_label(&m, m.label[i]) != (int)i || m.label[i] < 0)
          abort(); /* duplicates or a negative label got through */
      kiln_labelmap_free(&m);
    }
    return 0;
  }
  kiln_labelmap map;
  if (kiln_labelmap_parse(voc_map, strlen(voc_map), "voc", &map) != KILN_OK) abort();
  kiln_voc_annotation a;
  if (kiln_voc_parse(text, len, "fuzz.xml", &map, &a) == KILN_OK) {
    if (a.n == 0 || a.width < 1 || a.height < 1) abort();
    int seen[21] = {0};
    for (size_t i = 0; i < a.n; i++) {
      const kiln_anno_box *b = &a.object[i].box;
      if (!(b->box.xmin >= 0 && b->box.xmin <= b->box.xmax && b->box.xmax <= 1 &&
            b->box.ymin >= 0 && b->box.ymin <= b->box.ymax && b->box.ymax <= 1))
        abort();
      if (b->label < 0 || b->label > 20 || b->instance_id != seen[b->label]++)
        abort();
    }
    kiln_voc_free(&a);
  }
  kiln_labelmap_free(&map);
  return 0;
}
