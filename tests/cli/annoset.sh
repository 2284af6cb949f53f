# kiln convert annoset (the SSD fork's create_annoset) through the `kiln` command, on a tiny
# PASCAL VOC tree made here (PNG and JPEG images, colour and gray, written by kiln's own
# encoders through tests/support/annoset_tool; XML annotations; VOC's label map cut short): LMDB
# and LevelDB of raw and encoded records read back through the AnnotatedData layer's reader
# (annoset_tool dump: keys, shapes, pixel sums, every box), the name-size file exactly, the
# shuffle the same for the same seed, resizing and re-encoding as JPEG; then each bad input
# refused with a message naming the file and the line, and no database (nor a name-size file)
# left behind.
source "$(dirname "$0")/lib.bash"
cd "$WORK"
TOOL=${KILN_ANNOSET_TOOL:-$(dirname "$KILN")/tests/annoset_tool}
[ -x "$TOOL" ] || { echo "annoset.sh: no annoset_tool at $TOOL (build its target)"; exit 77; }
command -v python3 >/dev/null || { echo "annoset.sh: needs python3"; exit 77; }

mkdir -p VOC2007/JPEGImages VOC2007/Annotations
need "images" -- "$TOOL" png VOC2007/JPEGImages/000005.png 40 30 1
need "images" -- "$TOOL" jpeg VOC2007/JPEGImages/000007.jpg 24 20 2
need "images" -- "$TOOL" jpeg VOC2007/JPEGImages/000009.jpg 16 16 3 gray
need "images" -- "$TOOL" png VOC2007/JPEGImages/000012.png 10 12 4 gray

cat > labelmap.prototxt <<'EOF'
item { name: "none_of_the_above" label: 0 display_name: "background" }
item { name: "aeroplane" label: 1 display_name: "aeroplane" }
item { name: "bicycle" label: 2 display_name: "bicycle" }
item { name: "chair" label: 9 display_name: "chair" }
item { name: "person" label: 15 display_name: "person" }
EOF

# voc W H OBJECT...: an annotation; OBJECT is NAME:DIFFICULT:XMIN,YMIN,XMAX,YMAX
voc() {
  local w=$1 h=$2
  shift 2
  printf '<annotation>\n\t<folder>VOC2007</folder>\n\t<size>\n\t\t<width>%s</width>\n' "$w"
  printf '\t\t<height>%s</height>\n\t\t<depth>3</depth>\n\t</size>\n' "$h"
  local o
  for o in "$@"; do
    IFS=: read -r name diff box <<<"$o"
    IFS=, read -r x0 y0 x1 y1 <<<"$box"
    printf '\t<object>\n\t\t<name>%s</name>\n\t\t<pose>Left</pose>\n' "$name"
    printf '\t\t<difficult>%s</difficult>\n\t\t<bndbox>\n' "$diff"
    printf '\t\t\t<xmin>%s</xmin>\n\t\t\t<ymin>%s</ymin>\n' "$x0" "$y0"
    printf '\t\t\t<xmax>%s</xmax>\n\t\t\t<ymax>%s</ymax>\n\t\t</bndbox>\n\t</object>\n' "$x1" "$y1"
  done
  printf '</annotation>\n'
}
voc 40 30 person:0:1,2,20,29 chair:1:5,6,40,30 person:0:3,3,7,8 > VOC2007/Annotations/000005.xml
voc 24 20 aeroplane:0:0,0,24,20 > VOC2007/Annotations/000007.xml
voc 16 16 bicycle:1:2,2,14,15 > VOC2007/Annotations/000009.xml
voc 10 12 chair:0:1,1,9,11 chair:0:2,2,3,3 > VOC2007/Annotations/000012.xml
# the fork's trainval.txt: IMAGE ANNOTATION, relative to the root; a blank line between
{
  for i in 000005.png 000007.jpg; do echo "VOC2007/JPEGImages/$i VOC2007/Annotations/${i%.*}.xml"; done
  echo
  for i in 000009.jpg 000012.png; do echo "VOC2007/JPEGImages/$i VOC2007/Annotations/${i%.*}.xml"; done
} > trainval.txt

# What every dump must show: the keys in list order, and the boxes, normalised as the fork does
# (float xmin / width ...), grouped by label in ascending order, instance ids per label.
python3 - > want_boxes.txt <<'PY'
import struct
f = lambda v: struct.unpack('f', struct.pack('f', v))[0]
def boxes(w, h, objs):
    out = []
    for label in sorted({o[0] for o in objs}):
        for i, (l, d, x0, y0, x1, y1) in enumerate([o for o in objs if o[0] == label]):
            out.append('  box %d %d %s %s %s %s %d' % (label, i, *('%.9g' % f(f(a) / f(b)) for a, b in
                       ((x0, w), (y0, h), (x1, w), (y1, h))), d))
    return out
recs = [('000005.png', 40, 30, [(15, 0, 1, 2, 20, 29), (9, 1, 5, 6, 40, 30), (15, 0, 3, 3, 7, 8)]),
        ('000007.jpg', 24, 20, [(1, 0, 0, 0, 24, 20)]),
        ('000009.jpg', 16, 16, [(2, 1, 2, 2, 14, 15)]),
        ('000012.png', 10, 12, [(9, 0, 1, 1, 9, 11), (9, 0, 2, 2, 3, 3)])]
for i, (name, w, h, objs) in enumerate(recs):
    print('%08d_VOC2007/JPEGImages/%s' % (i, name))
    print('\n'.join(boxes(w, h, objs)))
PY
# boxes_of DUMP: the dump without its shapes and sums
boxes_of() { sed 's/ [0-9]*x[0-9]*x[0-9]* label .*//' "$1"; }

out=$("$KILN" convert annoset trainval.txt ./ raw_lmdb --label-map labelmap.prototxt \
  --name-size test_name_size.txt 2>&1) &&
  [ "$out" = "wrote 4 records (7 boxes) to raw_lmdb
wrote the images' sizes to test_name_size.txt" ] && pass || fail "convert annoset: $out"
printf '000005 30 40\n000007 20 24\n000009 16 16\n000012 12 10\n' > want_ns.txt
cmp -s test_name_size.txt want_ns.txt && pass || fail "name-size file: $(cat test_name_size.txt)"
need "dump raw_lmdb" -- bash -c "'$TOOL' dump raw_lmdb > raw.txt"
boxes_of raw.txt | diff want_boxes.txt - >&2 && pass || fail "raw_lmdb's keys and boxes"
# shapes (raw: colour, the images' own sizes) and the PNG images' pixels, summed
python3 - raw.txt <<'PY' && pass || fail "raw_lmdb's images: $(grep label raw.txt)"
import sys
lines = [l.split() for l in open(sys.argv[1]) if ' label ' in l]
shapes = [l[1] for l in lines]
assert shapes == ['3x30x40', '3x20x24', '3x16x16', '3x12x10'], shapes
assert all(l[3] == '-1' for l in lines)
# annoset_tool's pattern: plane k at (y, x) is seed * 29 + k * 70 + y * 3 + x * 2 (mod 256); the
# gray PNG's one plane is made three equal ones
s5 = sum((29 + k * 70 + y * 3 + x * 2) % 256 for k in range(3) for y in range(30) for x in range(40))
s12 = 3 * sum((4 * 29 + y * 3 + x * 2) % 256 for y in range(12) for x in range(10))
assert int(lines[0][5]) == s5 and int(lines[3][5]) == s12, (lines, s5, s12)
PY
"$TOOL" read raw_lmdb 2 > read2.txt 2>&1 && [ "$(cat read2.txt)" = "$(sed -n '/^00000002_/,/^00000003_/p' raw.txt | sed '$d')" ] &&
  pass || fail "random access to record 2: $(cat read2.txt)"

# LevelDB: the same records
out=$("$KILN" convert annoset trainval.txt ./ raw_leveldb --label-map labelmap.prototxt \
  --backend leveldb 2>&1) && [ -f raw_leveldb/CURRENT ] && pass || fail "convert --backend leveldb: $out"
"$TOOL" dump raw_leveldb > raw_ldb.txt 2>&1 && cmp -s raw.txt raw_ldb.txt && pass ||
  fail "LevelDB and LMDB differ: $(diff raw.txt raw_ldb.txt)"

# encoded: the files as they are (the same pixels), the gray JPEG made colour (re-encoded PNG)
out=$("$KILN" convert annoset trainval.txt ./ enc_lmdb --label-map labelmap.prototxt --encoded 2>&1) &&
  pass || fail "convert --encoded: $out"
"$TOOL" dump enc_lmdb > enc.txt 2>&1 && cmp -s raw.txt enc.txt && pass ||
  fail "encoded and raw records differ: $(diff raw.txt enc.txt)"
# gray, resized, re-encoded as JPEG, shuffled: the same seed gives the same database
for run in 1 2; do
  out=$("$KILN" convert annoset trainval.txt ./ small$run --label-map labelmap.prototxt --gray \
    --resize 8 9 --encode-type jpg --shuffle --seed 7 --backend leveldb 2>&1) || fail "convert --shuffle: $out"
  "$TOOL" dump small$run > small$run.txt 2>&1 || fail "dump small$run: $(cat small$run.txt)"
done
cmp -s small1.txt small2.txt && pass || fail "--shuffle --seed 7 twice: $(diff small1.txt small2.txt)"
[ "$(grep -c ' 1x8x9 label -1 ' small1.txt)" = 4 ] && pass || fail "--gray --resize 8 9: $(cat small1.txt)"
# the shuffled keys count 0..3 and name the same images, in another order
grep -o '^0000000[0-3]_' small1.txt | tr -d '\n' | grep -qx '00000000_00000001_00000002_00000003_' &&
  [ "$(grep -o '_VOC[^ ]*' small1.txt | sort)" = "$(grep -o '_VOC[^ ]*' raw.txt | sort)" ] &&
  [ "$(grep -o '_VOC[^ ]*' small1.txt)" != "$(grep -o '_VOC[^ ]*' raw.txt)" ] && pass ||
  fail "shuffled keys: $(grep label small1.txt)"
# a record's boxes go with its image wherever the shuffle puts it
key5=$(grep -o '^0000000._VOC2007/JPEGImages/000005.png' small1.txt)
[ "$(sed -n "\#^$key5#,/^0000/p" small1.txt | grep -c '  box')" = 3 ] && pass ||
  fail "000005's boxes after the shuffle: $(cat small1.txt)"
out=$("$KILN" convert annoset trainval.txt ./ other --label-map labelmap.prototxt --shuffle --seed 8 2>&1) &&
  "$TOOL" dump other > other.txt && [ "$(grep -o '_VOC[^ ]*' other.txt)" != "$(grep -o '_VOC[^ ]*' small1.txt)" ] &&
  pass || fail "--seed 8 orders as --seed 7 does: $out"
# --check-size passes where the sizes agree
out=$("$KILN" convert annoset trainval.txt ./ checked --label-map labelmap.prototxt --check-size 2>&1) &&
  pass || fail "--check-size on agreeing sizes: $out"

# ---- bad inputs: each names the file and the line; nothing is left behind ------------------
A=VOC2007/Annotations
# one_pair NAME IMAGE ANNOTATION: a list of that pair alone
one_pair() { printf 'VOC2007/JPEGImages/000005.png %s/000005.xml\nVOC2007/JPEGImages/%s %s\n' "$A" "$2" "$3" > "$1"; }

printf '<annotation>\n<size><width>16</width><height>16</height></size>\n<object><name>bicycle</name>\n</objet>\n</annotation>\n' > $A/broken.xml
one_pair broken.txt 000009.jpg $A/broken.xml
expect_refusal "XML not well formed" --want "broken.txt:2:" --want "$A/broken.xml:4: not well-formed XML" \
  --gone out_db --gone ns.txt -- "$KILN" convert annoset broken.txt ./ out_db --label-map labelmap.prototxt --name-size ns.txt
voc 16 16 > $A/empty.xml
one_pair empty.txt 000009.jpg $A/empty.xml
expect_refusal "an annotation with no objects" --want "empty.txt:2:" --want "$A/empty.xml:1: no objects" \
  --gone out_db -- "$KILN" convert annoset empty.txt ./ out_db --label-map labelmap.prototxt
: > $A/blank.xml
one_pair blank.txt 000009.jpg $A/blank.xml
expect_refusal "an empty annotation file" --want "blank.txt:2:" --want "$A/blank.xml:1: an empty file" \
  --gone out_db -- "$KILN" convert annoset blank.txt ./ out_db --label-map labelmap.prototxt
voc 16 16 bicycle:0:9,2,8,15 > $A/flipped.xml
one_pair flipped.txt 000009.jpg $A/flipped.xml
expect_refusal "xmin > xmax" --want "flipped.txt:2:" --want "$A/flipped.xml:12:" --want "xmin > xmax" \
  --gone out_db -- "$KILN" convert annoset flipped.txt ./ out_db --label-map labelmap.prototxt --backend leveldb
voc 16 16 bicycle:0:2,2,14,17 > $A/outside.xml
one_pair outside.txt 000009.jpg $A/outside.xml
expect_refusal "a box outside the image" --want "outside.txt:2:" --want "$A/outside.xml:12:" --want "ymax 17" \
  --gone out_db -- "$KILN" convert annoset outside.txt ./ out_db --label-map labelmap.prototxt
voc 16 16 bicycle:0:2,2,14,15 cow:0:1,1,2,2 > $A/cow.xml
one_pair cow.txt 000009.jpg $A/cow.xml
expect_refusal "a label not in the map" --want "cow.txt:2:" --want "$A/cow.xml:20:" \
  --want "'cow' is not in the label map labelmap.prototxt" \
  --gone out_db -- "$KILN" convert annoset cow.txt ./ out_db --label-map labelmap.prototxt
printf 'item { name: "chair" label: 9 }\nitem { name: "person" label: 15 }\nitem {\n  name: "sofa"\n  label: 9\n}\n' > dup.prototxt
expect_refusal "a label map with duplicates" --want "dup.prototxt:3:" --want "item 1 (line 1) ('chair') and item 3 (line 3) ('sofa')" \
  --want "same label 9" --gone out_db -- "$KILN" convert annoset trainval.txt ./ out_db --label-map dup.prototxt
printf 'item { name: "chair" label: 9 }\nitem { name: "chair" label: 10 }\n' > dupname.prototxt
expect_refusal "a label map naming a class twice" --want "dupname.prototxt:2:" --want "same name 'chair'" \
  --gone out_db -- "$KILN" convert annoset trainval.txt ./ out_db --label-map dupname.prototxt
printf 'item { name: "chair" label: 9 }\nitem { name: "chair" lable: 10 }\n' > typo.prototxt
expect_refusal "a label map that does not parse" --want "typo.prototxt:2:" --want "unknown field 'lable'" \
  --gone out_db -- "$KILN" convert annoset trainval.txt ./ out_db --label-map typo.prototxt
one_pair missing.txt 000099.jpg $A/000009.xml
expect_refusal "a missing image" --want "missing.txt:2:" --want "VOC2007/JPEGImages/000099.jpg" \
  --gone out_db --gone ns.txt -- "$KILN" convert annoset missing.txt ./ out_db --label-map labelmap.prototxt --name-size ns.txt
one_pair noxml.txt 000009.jpg $A/000099.xml
expect_refusal "a missing annotation" --want "noxml.txt:2:" --want "$A/000099.xml" \
  --gone out_db -- "$KILN" convert annoset noxml.txt ./ out_db --label-map labelmap.prototxt
head -c 100 VOC2007/JPEGImages/000007.jpg > VOC2007/JPEGImages/cut.jpg
one_pair cut.txt cut.jpg $A/000007.xml
expect_refusal "a truncated image" --want "cut.txt:2:" --want "VOC2007/JPEGImages/cut.jpg" \
  --gone out_db -- "$KILN" convert annoset cut.txt ./ out_db --label-map labelmap.prototxt --encoded
one_pair wrongsize.txt 000009.jpg $A/000007.xml
expect_refusal "--check-size on different sizes" --want "wrongsize.txt:2:" \
  --want "000009.jpg: the image is 16 x 16 (width x height), but its annotation ./$A/000007.xml says 24 x 20" \
  --gone out_db -- "$KILN" convert annoset wrongsize.txt ./ out_db --label-map labelmap.prototxt --check-size
printf 'VOC2007/JPEGImages/000005.png %s/000005.xml\n\nVOC2007/JPEGImages/000009.jpg\n' "$A" > onefield.txt
expect_refusal "a list line of one field" --want "onefield.txt:3: one field" \
  --gone out_db -- "$KILN" convert annoset onefield.txt ./ out_db --label-map labelmap.prototxt
expect_refusal "an existing output" --want "raw_lmdb: already exists" --same raw_lmdb -- \
  "$KILN" convert annoset trainval.txt ./ raw_lmdb --label-map labelmap.prototxt
expect_refusal "an existing LevelDB output" --want "already exists" --same raw_leveldb -- \
  "$KILN" convert annoset trainval.txt ./ raw_leveldb --label-map labelmap.prototxt --backend leveldb
expect_refusal "name-size over the list" --want "trainval.txt" --gone out_db --same trainval.txt -- \
  "$KILN" convert annoset trainval.txt ./ out_db --label-map labelmap.prototxt --name-size trainval.txt

# bad command lines: exit 2
expect_refusal "no --label-map" --code 2 --want "--label-map" --gone out_db -- \
  "$KILN" convert annoset trainval.txt ./ out_db
expect_refusal "--seed without --shuffle" --code 2 --want "--shuffle" --gone out_db -- \
  "$KILN" convert annoset trainval.txt ./ out_db --label-map labelmap.prototxt --seed 3
expect_refusal "an unknown encoding" --code 2 --want "jpg or png" --gone out_db -- \
  "$KILN" convert annoset trainval.txt ./ out_db --label-map labelmap.prototxt --encode-type gif
expect_refusal "an unknown backend" --code 2 --want "lmdb or leveldb" --gone out_db -- \
  "$KILN" convert annoset trainval.txt ./ out_db --label-map labelmap.prototxt --backend hdf5
expect_refusal "half a resize" --code 2 --want "--resize" --gone out_db -- \
  "$KILN" convert annoset trainval.txt ./ out_db --label-map labelmap.prototxt --resize 4
expect_refusal "a fourth argument" --code 2 --want "unexpected argument" --gone out_db -- \
  "$KILN" convert annoset trainval.txt ./ out_db extra --label-map labelmap.prototxt

finish
