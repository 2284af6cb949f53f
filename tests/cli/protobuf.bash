# Protobuf's binary encoding from the shell, for tests that write .caffemodel and .solverstate
# files by hand (sourced, not a test). Every function prints hex digits; pb_write turns them into
# bytes. Field numbers and types: docs/formats.md and src/proto/kiln.proto.

# pb_uvarint N: N (an integer of bash's 64 bits; a negative one as its two's complement, ten
# bytes, as protobuf encodes a negative int32 or int64) as a base-128 varint.
pb_uvarint() {
  local v=$1 b out=""
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    b=$((v & 0x7f))
    v=$(((v >> 7) & 0x01ffffffffffffff)) # a logical shift
    if [ "$v" -eq 0 ]; then
      out+=$(printf '%02x' "$b")
      break
    fi
    out+=$(printf '%02x' $((b | 0x80)))
  done
  printf '%s' "$out"
}

# pb_key FIELD WIRETYPE
pb_key() { pb_uvarint $(($1 << 3 | $2)); }

# pb_int FIELD N: a varint field (int32, int64, uint32, bool, enum).
pb_int() { pb_key "$1" 0; pb_uvarint "$2"; }

# pb_bytes FIELD HEX: a length-delimited field (a nested message, bytes, a packed list).
pb_bytes() { pb_key "$1" 2; pb_uvarint $((${#2} / 2)); printf '%s' "$2"; }

# pb_string FIELD TEXT
pb_string() { pb_bytes "$1" "$(printf '%s' "$2" | od -An -v -tx1 | tr -d ' \n')"; }

# pb_floats FIELD X...: a packed repeated float (nan, inf and -inf allowed).
pb_floats() {
  local f=$1
  shift
  pb_bytes "$f" "$(perl -e 'print unpack("H*", pack("f<*", @ARGV))' -- "$@")"
}

# pb_float FIELD X: one float field (fixed32).
pb_float() { pb_key "$1" 5; perl -e 'print unpack("H*", pack("f<", $ARGV[0]))' -- "$2"; }

# pb_double FIELD X: one double field (fixed64).
pb_double() { pb_key "$1" 1; perl -e 'print unpack("H*", pack("d<", $ARGV[0]))' -- "$2"; }

# pb_varints FIELD N...: a packed repeated varint (BlobShape's dim).
pb_varints() {
  local f=$1 body="" n
  shift
  for n in "$@"; do body+=$(pb_uvarint "$n"); done
  pb_bytes "$f" "$body"
}

# pb_write FILE HEX: the bytes.
pb_write() { perl -e 'print pack("H*", $ARGV[0])' -- "$2" > "$1"; }

# pb_blob DIMS VALUES...: a BlobProto with shape { dim: DIMS (comma-separated) } and packed float
# data VALUES ("-" for no data field).
pb_blob() {
  local dims=$1
  shift
  local shape
  shape=$(pb_bytes 7 "$(pb_varints 1 ${dims//,/ })")
  if [ "$1" = "-" ]; then printf '%s' "$shape"; else printf '%s%s' "$shape" "$(pb_floats 5 "$@")"; fi
}

# pb_fill N X: N copies of X, separated by spaces.
pb_fill() { local i; for ((i = 0; i < $1; i++)); do printf '%s ' "$2"; done; }
