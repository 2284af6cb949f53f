# The CE report as a browser shows it: a tiny suite (LeNet, 20 iterations, on 1 and 2 workers)
# run, accepted and run again, so report.html has a pass/fail grid with links to each run's files,
# baselines, trend lines over two runs, and per worker count convergence curves beside the
# baseline's dashed ones; headless Chromium renders it. The rendered DOM must hold the grid and
# the inline SVG charts with their lines; a script in the page counts the convergence curves as
# drawn (a solid one per worker count and a dashed baseline for each, every one with a non-empty
# box), and the same count on a copy with one baseline curve taken out must see it missing; every
# label of the charts must lie inside its chart as the browser lays the text out (and be no wider
# than the report's estimate, from which it sizes its margins), and the screenshot must be a
# real 1200x1300 PNG showing them (the grid's pass colour and both worker counts' series colours
# among its pixels). The screenshot and the report are kept as CI artifacts:
# $KILN_BUILD_DIR/artifacts/ce-report.png and ce-report.html. Without MPI (no mpirun, or kiln
# built without it) the suite runs 1 worker and the checks expect that.
# Skips (exit 77, a CTest skip) when Chromium is not installed (Debian: apt-get install chromium, in
# scripts/install-deps).
source "$(dirname "$0")/lib.bash"
cd "$WORK"
export NO_COLOR=1
unset KILN_FAULT

CHROMIUM=${CHROMIUM:-$(command -v chromium || command -v chromium-browser || true)}
if [ -z "$CHROMIUM" ]; then
  echo "SKIP: chromium is not installed (Debian: apt-get install chromium); the report was not checked in a browser"
  exit 77
fi
ARTIFACTS=${KILN_BUILD_DIR:-$(dirname "$KILN")}/artifacts
mkdir -p "$ARTIFACTS" || { fail "cannot create $ARTIFACTS"; finish; exit; }
rm -f "$ARTIFACTS/ce-report.png" "$ARTIFACTS/ce-report.html"
"$KILN" data fetch fashion-mnist >/dev/null 2>&1 || { fail "data fetch"; finish; exit; }

WORKERS="1 2"
if ! command -v mpirun >/dev/null 2>&1 || [ "${KILN_HAVE_MPI:-1}" = 0 ]; then
  WORKERS=1
  echo "note: no MPI here, the suite runs 1 worker only"
fi
cat > suite.prototxt <<SUITE
name: "browser"
repeats: 1
model {
  name: "lenet"
  solver: "$SRC/models/lenet/lenet_solver.prototxt"
$(for w in $WORKERS; do echo "  workers: $w"; done)
  max_iter: 20
  test_interval: 10
  test_iter: 2
  threads: 1
  dataset: "fashion-mnist"
  kpi { name: "accuracy" floor: 0 abs_tolerance: 1 }
  kpi { name: "train_loss" rel_tolerance: 1 }
  kpi { name: "peak_rss_mb" rel_tolerance: 1 }
  kpi { name: "samples_per_s" rel_tolerance: 0.9 }
}
SUITE
run() {  # run DIR: one suite run, which must pass
  local out rc
  out=$("$KILN" ce run suite.prototxt --db "$WORK/ce.db" --report-dir "$WORK/$1" --machine-class browser-test 2>&1)
  rc=$?
  [ $rc -eq 0 ] && pass || fail "ce run $1: exit $rc: $out"
}
run r1
"$KILN" ce accept suite.prototxt --db "$WORK/ce.db" > acc.txt 2>&1 && pass || fail "accept: $(cat acc.txt)"
run r2
report=$WORK/r2/report.html
[ -s "$report" ] || { fail "no report"; finish; exit; }
cp "$report" "$ARTIFACTS/ce-report.html"

# Chromium as root needs --no-sandbox; its own profile folder keeps it out of $HOME; timeout: a
# browser that hangs is a failure, not a stuck test.
browser() {
  timeout -k 5 90 "$CHROMIUM" --headless --no-sandbox --disable-gpu --disable-dev-shm-usage \
    --no-first-run --user-data-dir="$WORK/profile" --window-size=1200,1300 \
    --hide-scrollbars "$@" "file://${page:-$report}"
}
browser --dump-dom > dom.html 2> dom.err
rc=$?
[ $rc -eq 0 ] && [ -s dom.html ] && pass || fail "chromium --dump-dom: exit $rc: $(tail -n 5 dom.err)"
grep -q '<table class="grid">' dom.html && pass || fail "rendered DOM has no grid table"
grep -Eq '<td class="name">lenet</td><td>1</td>(<td class="pass" title="[^"]*">)' dom.html \
  && pass || fail "the grid has no passing lenet row: $(grep -o '<tr>.*</tr>' dom.html | head -n 3)"
for w in $WORKERS; do
  for f in train.log metrics.jsonl; do
    grep -q "<a href=\"runs/lenet-w$w-r1/$f\">" dom.html && pass \
      || fail "the grid does not link runs/lenet-w$w-r1/$f"
  done
done
nsvg=$(grep -o '<svg class="trend"' dom.html | wc -l)
[ "$nsvg" -eq 4 ] && pass || fail "expected 4 trend plots (one per KPI), the DOM has $nsvg"
ncurves=$(grep -o '<svg class="curves"' dom.html | wc -l)
[ "$ncurves" -eq 4 ] && pass \
  || fail "expected 4 convergence charts (loss and accuracy against iteration and seconds), got $ncurves"
nscaling=$(grep -o '<svg class="scaling"' dom.html | wc -l)
[ "$nscaling" -eq $(( $(echo $WORKERS | wc -w) > 1 ? 1 : 0 )) ] && pass \
  || fail "expected a scaling chart only with 2 worker counts, the DOM has $nscaling"
grep -Eq '<polyline [^>]*points="[0-9.]+,[0-9.]+ [0-9.]+,[0-9.]+"' dom.html \
  && pass || fail "no trend line over the two runs in the rendered SVG"
grep -q 'stroke-dasharray' dom.html && pass || fail "no dashed baseline in the plots"

# The convergence curves as the browser draws them: in each chart, per worker count, a solid
# curve of this run and a dashed one of the baseline, each with a box of some size (getBBox), in
# the same colour. A copy of the page with its script writes what it saw into the page, one chart
# a line ("run 1 2 | baseline 1 2").
cat > curves.html <<'JS'
<script>
var lines = [];
document.querySelectorAll("svg.curves").forEach(function (svg) {
  var seen = {run: [], baseline: []}, colour = {};
  svg.querySelectorAll("polyline.curve").forEach(function (p) {
    var b = p.getBBox(), dash = getComputedStyle(p).strokeDasharray;
    var kind = p.getAttribute("data-kind"), w = p.getAttribute("data-workers");
    if (!(b.width > 0) || !seen[kind]) return;
    if ((kind === "baseline") !== (dash !== "none" && dash !== "")) return;
    if (kind === "run") colour[w] = p.getAttribute("stroke");
    else if (colour[w] !== p.getAttribute("stroke")) return;
    seen[kind].push(w);
  });
  lines.push("run " + seen.run.join(" ") + " | baseline " + seen.baseline.join(" "));
});
var p = document.createElement("pre");
p.id = "curves";
p.textContent = lines.join("\n");
document.body.appendChild(p);
</script>
JS
curves_drawn() {  # curves_drawn PAGE: what the script saw, one chart a line
  awk 'index($0, "</body>") { while ((getline l < "curves.html") > 0) print l } { print }' "$1" > counted.html
  page=$WORK/counted.html browser --dump-dom 2> counted.err \
    | awk '/<pre id="curves">/ { on = 1; sub(/.*<pre id="curves">/, "") }
           on { if (sub(/<\/pre>.*/, "")) { print; on = 0 } else print }'
}
want=$(for i in 1 2 3 4; do echo "run $WORKERS | baseline $WORKERS"; done)
got=$(curves_drawn "$report")
[ "$got" = "$want" ] && pass || fail "convergence curves drawn: expected
$want
got
${got:-nothing: $(tail -n 3 counted.err)}"
# the same count must see a baseline curve that is not there
awk '!done && /data-kind="baseline"/ { done = 1; next } { print }' "$report" > planted.html
got=$(curves_drawn "$WORK/planted.html")
[ -n "$got" ] && [ "$got" != "$want" ] && pass \
  || fail "the count did not notice a missing baseline curve: $got"

# The plots' text as the browser lays it out: a copy of the report with a script that measures
# every label (getBBox) writes what does not fit into the page. The report sizes its margins
# from an estimate of 0.65 em a character (src/ce/report.c); the real text must be no wider, and
# every label must lie inside its plot's viewBox (a long y label was clipped at the left).
cat > fit.html <<'JS'
<script>
var out = [];
document.querySelectorAll("svg").forEach(function (svg, i) {
  var vb = svg.viewBox.baseVal;
  svg.querySelectorAll("text").forEach(function (t) {
    var b = t.getBBox(), est = 0.65 * parseFloat(t.getAttribute("font-size")) * t.textContent.length;
    if (b.x < vb.x - 0.5 || b.x + b.width > vb.x + vb.width + 0.5)
      out.push("plot " + i + ": '" + t.textContent + "' spans " + b.x.toFixed(1) + " to " + (b.x + b.width).toFixed(1));
    if (b.width > est + 0.5)
      out.push("plot " + i + ": '" + t.textContent + "' is " + b.width.toFixed(1) + " px wide, estimated " + est.toFixed(1));
  });
});
var p = document.createElement("pre");
p.id = "fit";
p.textContent = out.length ? out.join("; ") : "every label fits";
document.body.appendChild(p);
</script>
JS
awk 'index($0, "</body>") { while ((getline l < "fit.html") > 0) print l } { print }' "$report" > measured.html
page=$WORK/measured.html browser --dump-dom > measured_dom.html 2> measured.err
fit=$(sed -n 's#.*<pre id="fit">\([^<]*\)</pre>.*#\1#p' measured_dom.html)
[ "$fit" = "every label fits" ] && pass || fail "labels in the browser: ${fit:-no result: $(tail -n 3 measured.err)}"

browser --screenshot="$ARTIFACTS/ce-report.png" > shot.out 2>&1
rc=$?
[ $rc -eq 0 ] && [ -s "$ARTIFACTS/ce-report.png" ] && pass \
  || fail "chromium --screenshot: exit $rc: $(tail -n 5 shot.out)"

# The PNG: signature, IHDR size, and the pixels (decoded with the standard library): many
# colours, and the grid's pass green (#dff3df), the first series' blue (#1f77b4) and, with two
# worker counts, the second's green (#2ca02c) among them.
if command -v python3 >/dev/null; then
  check=$(python3 - "$ARTIFACTS/ce-report.png" "$WORKERS" <<'PY'
import struct, sys, zlib
data = open(sys.argv[1], "rb").read()
if data[:8] != b"\x89PNG\r\n\x1a\n":
    sys.exit("not a PNG (signature)")
pos, chunks = 8, []
while pos < len(data):
    n, kind = struct.unpack(">I4s", data[pos:pos + 8])
    chunks.append((kind, data[pos + 8:pos + 8 + n]))
    pos += 12 + n
if chunks[0][0] != b"IHDR":
    sys.exit("the first chunk is not IHDR")
w, h, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", chunks[0][1])
if (w, h) != (1200, 1300):
    sys.exit("IHDR says %dx%d, the window was 1200x1300" % (w, h))
if depth != 8 or ctype not in (2, 6) or interlace:
    sys.exit("unexpected PNG format: depth %d, colour type %d, interlace %d" % (depth, ctype, interlace))
bpp = 3 if ctype == 2 else 4
raw = zlib.decompress(b"".join(c for k, c in chunks if k == b"IDAT"))
stride = w * bpp
prev, colours = bytearray(stride), {}
for y in range(h):
    f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
    for i in range(stride):
        a = line[i - bpp] if i >= bpp else 0
        b, c = prev[i], prev[i - bpp] if i >= bpp else 0
        if f == 1: line[i] = (line[i] + a) & 255
        elif f == 2: line[i] = (line[i] + b) & 255
        elif f == 3: line[i] = (line[i] + (a + b) // 2) & 255
        elif f == 4:
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    for x in range(0, stride, bpp):
        px = bytes(line[x:x + 3])
        colours[px] = colours.get(px, 0) + 1
    prev = line
top = max(colours.values())
want = {"pass green #dff3df": bytes((0xdf, 0xf3, 0xdf)), "series blue #1f77b4": bytes((0x1f, 0x77, 0xb4))}
if len(sys.argv[2].split()) > 1:
    want["second series green #2ca02c"] = bytes((0x2c, 0xa0, 0x2c))
missing = [name for name, px in want.items() if colours.get(px, 0) < 20]
print("%dx%d, %d colours, %.1f%% not the background, %s" % (w, h, len(colours),
      100.0 * (w * h - top) / (w * h), ", ".join("%s: %d px" % (n, colours.get(p, 0)) for n, p in want.items())))
if len(colours) < 50 or w * h - top < 0.02 * w * h:
    sys.exit("the screenshot is (nearly) a flat colour")
if missing:
    sys.exit("the screenshot lacks " + ", ".join(missing))
PY
)
  rc=$?
  echo "screenshot: $check"
  [ $rc -eq 0 ] && pass || fail "screenshot: $check"
else
  # without python3: the signature, and a size well above a blank page's few kilobytes
  [ "$(head -c 8 "$ARTIFACTS/ce-report.png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] \
    && [ "$(stat -c %s "$ARTIFACTS/ce-report.png")" -gt 30000 ] && pass || fail "screenshot is no real PNG"
fi
echo "artifacts: $ARTIFACTS/ce-report.png $ARTIFACTS/ce-report.html"
finish
