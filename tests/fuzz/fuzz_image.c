/* The image decoders (PNG through libpng, JPEG through libjpeg) and the image list reader. The
 * first byte picks: bit 7 set, the rest is an image list; else the rest is an image, decoded as
 * it is, in colour or in gray (byte % 3), resized to 7 x 5 when bit 2 is set. An image that
 * decodes must survive kiln's PNG writer and decode back to the same planes. */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "kiln/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  if (mode & 0x80) {
    const char *path = fuzz_temp_file(data + 1, size - 1, ".txt");
    kiln_image_list list;
    if (path && kiln_image_list_read(path, &list) == KILN_OK) kiln_image_list_free(&list);
    return 0;
  }
  kiln_image img = {0}, again = {0};
  const kiln_image_color color = (kiln_image_color)(mode % 3);
  const int h = mode & 4 ? 7 : 0, w = mode & 4 ? 5 : 0;
  if (kiln_image_decode(data + 1, size - 1, color, h, w, "fuzz", &img) == KILN_OK) {
    uint8_t *png = NULL;
    size_t len = 0;
    if (kiln_image_encode_png(img.data, img.channels, img.height, img.width, &png, &len) ==
        KILN_OK) {
      if (kiln_image_decode(png, len, KILN_IMAGE_AS_IS, 0, 0, "fuzz png", &again) != KILN_OK ||
          again.channels != img.channels || again.height != img.height ||
          again.width != img.width ||
          memcmp(again.data, img.data, (size_t)img.channels * img.height * img.width))
        abort(); /* kiln's own PNG did not read back */
      free(png);
    }
  }
  kiln_image_free(&img);
  kiln_image_free(&again);
  return 0;
}
