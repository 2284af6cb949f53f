# VOC 2007's tar layout made from shapes-det's images, for the `kiln data fetch voc2007 --from`
# tests (sourced after lib.bash, with E the shapes-det entry's folder; not a test):
#   - voc_tree DIR SPLIT ID...: DIR/VOCdevkit/VOC2007 with the images ID... (JPEGImages), their
#     annotations with the classes renamed to VOC's (disc dog, square tvmonitor, triangle
#     aeroplane, cross person) and ImageSets/Main/SPLIT.txt listing them; with VOC_OTHER_TASKS=1
#     also what VOC's other tasks put beside them (a class's list, dog_SPLIT.txt, and the
#     segmentation task's files), which the import passes over.
voc_tree() {
  local dir=$1 split=$2 id
  shift 2
  local v=$dir/VOCdevkit/VOC2007
  mkdir -p $v/JPEGImages $v/Annotations $v/ImageSets/Main
  [ "${VOC_OTHER_TASKS:-0}" = 1 ] && mkdir -p $v/SegmentationClass $v/ImageSets/Segmentation
  : > $v/ImageSets/Main/$split.txt
  for id in "$@"; do
    cp $E/JPEGImages/$id.jpg $v/JPEGImages/
    sed 's/shapes-det/VOC2007/; s/>disc</>dog</; s/>square</>tvmonitor</; s/>triangle</>aeroplane</; s/>cross</>person</' \
      $E/Annotations/$id.xml > $v/Annotations/$id.xml
    echo $id >> $v/ImageSets/Main/$split.txt
    if [ "${VOC_OTHER_TASKS:-0}" = 1 ]; then
      echo "$id  1" >> $v/ImageSets/Main/dog_$split.txt
      echo png > $v/SegmentationClass/$id.png
      echo $id >> $v/ImageSets/Segmentation/$split.txt
    fi
  done
}
