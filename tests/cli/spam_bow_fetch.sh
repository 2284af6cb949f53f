# `kiln data fetch spam-bow` on a small spam-assassin entry of the cache: each split's mails as
# libsvm rows over the entry's vocabulary (the words a mail holds, 1/sqrt(distinct words) each,
# feature i = word id i - 1, unknown words as <unk>), the vocabulary beside them, SHA256SUMS and
# READY; listed by `kiln data list`; a second fetch changes nothing; a damaged file is found and
# rebuilt; a spam-assassin entry without its vocabulary gets one first; and LibSVMData reads the
# rows.
source "$(dirname "$0")/lib.bash"
cd "$WORK"
export KILN_DATA="$WORK/cache"
mkdir -p cache/spam-assassin
printf '0\tHello world\n1\tBuy now, buy!\n' > cache/spam-assassin/train.tsv
printf '0\thello\n' > cache/spam-assassin/valid.tsv
printf '1\tNOW now now\n0\t\n' > cache/spam-assassin/test.tsv
printf '# kiln vocabulary: level word, lowercase 1, 6 tokens\n<pad>\n<unk>\nbuy\nnow\nhello\nworld\n' \
  > cache/spam-assassin/vocab.txt
echo "spam-assassin" > cache/spam-assassin/READY

out=$("$KILN" data fetch spam-bow 2>&1) && [ "$out" = "cached: $WORK/cache/spam-bow" ] && pass \
  || fail "fetch: $out"
# "buy now , buy !": buy (id 2), now (3), and ',' and '!' unknown (1): features 2, 3, 4
printf '0 5:0.707107 6:0.707107\n1 2:0.57735 3:0.57735 4:0.57735\n' > want-train.svm
cmp -s want-train.svm cache/spam-bow/train.svm && pass \
  || fail "train.svm: $(cat cache/spam-bow/train.svm)"
[ "$(cat cache/spam-bow/valid.svm)" = "0 5:1" ] && pass || fail "valid.svm: $(cat cache/spam-bow/valid.svm)"
printf '1 4:1\n0\n' > want-test.svm
cmp -s want-test.svm cache/spam-bow/test.svm && pass || fail "test.svm: $(cat cache/spam-bow/test.svm)"
cmp -s cache/spam-assassin/vocab.txt cache/spam-bow/vocab.txt && pass || fail "vocab.txt differs"
grep -q "^dim 6$" cache/spam-bow/READY && grep -q "^train.svm 2 records, 5 entries$" cache/spam-bow/READY \
  && grep -q "^test.svm 2 records, 1 entries$" cache/spam-bow/READY && pass \
  || fail "READY: $(cat cache/spam-bow/READY)"
[ "$(awk '{print $2}' cache/spam-bow/SHA256SUMS | tr '\n' ' ')" = "test.svm train.svm valid.svm vocab.txt " ] \
  && pass || fail "SHA256SUMS: $(cat cache/spam-bow/SHA256SUMS)"
"$KILN" data list | grep -q "^spam-bow  *yes " && pass || fail "data list: $("$KILN" data list)"

before=$(fingerprint cache/spam-bow; cksum cache/spam-bow/*)
out=$("$KILN" data fetch spam-bow 2>&1) && [ "$out" = "already cached: $WORK/cache/spam-bow" ] && pass \
  || fail "second fetch: $out"
[ "$(fingerprint cache/spam-bow; cksum cache/spam-bow/*)" = "$before" ] && pass \
  || fail "the second fetch changed the entry"

echo "1 1:1" > cache/spam-bow/train.svm
out=$("$KILN" data fetch spam-bow 2>&1) && echo "$out" | grep -q "spam-bow: damaged" && pass \
  || fail "damaged entry: $out"
cmp -s want-train.svm cache/spam-bow/train.svm && pass || fail "not rebuilt: $(cat cache/spam-bow/train.svm)"

# a spam-assassin entry cached before the sets had vocabularies gets its vocab.txt first
mkdir -p old/spam-assassin
for i in 1 2 3 4 5; do printf '1\tbuy now\n0\thello\n'; done > old/spam-assassin/train.tsv
: > old/spam-assassin/valid.tsv
: > old/spam-assassin/test.tsv
echo "spam-assassin" > old/spam-assassin/READY
out=$(KILN_DATA="$WORK/old" "$KILN" data fetch spam-bow 2>&1) && [ -f old/spam-assassin/vocab.txt ] \
  && cmp -s old/spam-assassin/vocab.txt old/spam-bow/vocab.txt && grep -q "^dim 5$" old/spam-bow/READY \
  && [ "$(wc -l < old/spam-bow/train.svm)" = 10 ] && pass \
  || fail "older spam-assassin: $out; READY: $(cat old/spam-bow/READY 2>&1)"

# the rows through LibSVMData (dim from READY) into logistic regression, one step
cat > net.prototxt <<'NET'
layer { name: "data" type: "LibSVMData" top: "x" top: "label"
  libsvm_data_param { source: "$KILN_DATA/spam-bow/train.svm" batch_size: 2 dim: 6 } }
layer { name: "fc" type: "InnerProduct" bottom: "x" top: "fc" inner_product_param { num_output: 2 } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc" bottom: "label" top: "loss" }
NET
printf 'net: "net.prototxt"\nbase_lr: 0.1\nlr_policy: "fixed"\nmax_iter: 1\ndisplay: 1\n' > solver.prototxt
out=$("$KILN" train --solver solver.prototxt 2>&1) && echo "$out" | grep -q "iter 0  loss 0.6931" && pass \
  || fail "training on spam-bow: $out"
finish
