#!/bin/sh
# test-quantize.sh - `backplane quantize`: seeded models written by the tool itself (run
# --save-gguf) quantised to every single type and every llama.cpp mix; the plans (--dry-run)
# against hand-written expectations from llama.cpp's rules; the outputs read back by the GGUF
# reader (each tensor's type as planned, the metadata kept, general.file_type set); importance
# matrix files; argument and input errors. Types this build has no quantiser for are asked of
# the tool (the plan's "no quantizer" line) and must then be refused with the library's
# sentence, so the test holds before and after their quantisers exist. Run by make check.
set -u
tool="${top_builddir:-.}/tools/backplane"
. "$(dirname "$0")/check.sh"
export BP_PLUGIN_PATH="$BP_TEST_CPU_PLUGIN_DIR" BP_PLUGIN_SYSTEM_PATH= BP_LOG_LEVEL=none

"$tool" run --model tiny --save-gguf "$tmp/tiny.gguf" >/dev/null || { echo "FAIL: save tiny"; exit 1; }
"$tool" run --model small --wtype q8_0 --save-gguf "$tmp/small.gguf" >/dev/null ||
    { echo "FAIL: save small"; exit 1; }

# plan FILE TYPE [OPTIONS]: "name to-type [fallback-from]" per tensor.
plan() {
    f=$1 t=$2
    shift 2
    "$tool" quantize --dry-run "$@" "$f" "$t" | awk '$4 == "->" { print $1, $5, ($7 == "fallback" ? $9 : "") }'
}
# expect FILE TYPE "name type" ... - each named tensor is planned in that type.
# Options (--pure, --imatrix FILE) may come before the names.
expect() {
    f=$1 t=$2 opts=
    shift 2
    while :; do
        case ${1-} in
        --pure) opts="$opts $1" && shift ;;
        --imatrix) opts="$opts $1 $2" && shift 2 ;;
        *) break ;;
        esac
    done
    # shellcheck disable=SC2086 # (the options are words without spaces)
    plan "$f" "$t" $opts >"$tmp/plan" || return 1
    for want in "$@"; do
        grep -q "^$want\( \|$\)" "$tmp/plan" || { echo "$t: wanted '$want'"; return 1; }
    done
}

# ---- Plans: llama.cpp's rules, by hand -------------------------------------------------------
# small: 8 layers, rows of 512 (k-quants fit) except ffn_down (1408: falls back), 8 heads and
# 8 KV heads, its own output.weight. use_more_bits picks layers 0, 3, 6 and 7 of 8.
check "Q4_K_M: attn_v of layers 0,3,6,7 q6_K, the others q4_K; output q6_K" \
    expect "$tmp/small.gguf" Q4_K_M "blk.0.attn_v.weight q6_K" "blk.1.attn_v.weight q4_K" \
    "blk.3.attn_v.weight q6_K" "blk.6.attn_v.weight q6_K" "blk.7.attn_v.weight q6_K" \
    "blk.2.attn_v.weight q4_K" "output.weight q6_K" "token_embd.weight q4_K" \
    "blk.0.attn_q.weight q4_K" "blk.5.ffn_gate.weight q4_K" "output_norm.weight f32" \
    "blk.0.attn_norm.weight f32"
check "Q4_K_M: ffn_down rows of 1408 fall back, q6_K to q8_0, q4_K to q5_0" \
    expect "$tmp/small.gguf" Q4_K_M "blk.0.ffn_down.weight q8_0 q6_K" \
    "blk.1.ffn_down.weight q5_0 q4_K" "blk.3.ffn_down.weight q8_0 q6_K" \
    "blk.7.ffn_down.weight q8_0 q6_K"
check "Q4_K_S: attn_v of the first 4 layers q5_K; ffn_down of layer 0 q5_K -> q5_1" \
    expect "$tmp/small.gguf" Q4_K_S "blk.3.attn_v.weight q5_K" "blk.4.attn_v.weight q4_K" \
    "blk.0.ffn_down.weight q5_1 q5_K" "blk.1.ffn_down.weight q5_0 q4_K" "output.weight q6_K"
check "Q5_K_M: as Q4_K_M on q5_K, q5_K falling back to q5_1" \
    expect "$tmp/small.gguf" Q5_K_M "blk.0.attn_v.weight q6_K" "blk.1.attn_v.weight q5_K" \
    "blk.1.ffn_down.weight q5_1 q5_K" "blk.6.ffn_down.weight q8_0 q6_K" "output.weight q6_K"
check "Q5_K_S: q5_K everywhere, output q6_K" \
    expect "$tmp/small.gguf" Q5_K_S "blk.0.attn_v.weight q5_K" "blk.0.ffn_down.weight q5_1 q5_K" \
    "output.weight q6_K" "token_embd.weight q5_K"
check "Q6_K: q6_K, ffn_down q8_0" \
    expect "$tmp/small.gguf" Q6_K "blk.2.attn_k.weight q6_K" "blk.2.ffn_down.weight q8_0 q6_K" \
    "output.weight q6_K"
check "Q3_K_M: attn_v q5_K then q4_K, attn_output q4_K, ffn_down q4_K -> q5_0" \
    expect "$tmp/small.gguf" Q3_K_M "blk.0.attn_v.weight q5_K" "blk.1.attn_v.weight q5_K" \
    "blk.2.attn_v.weight q4_K" "blk.0.attn_output.weight q4_K" "blk.0.attn_q.weight q3_K" \
    "blk.0.ffn_down.weight q5_0 q4_K" "output.weight q6_K"
check "Q3_K_S: q3_K, ffn_down q3_K -> q4_0" \
    expect "$tmp/small.gguf" Q3_K_S "blk.0.attn_v.weight q3_K" "blk.0.ffn_down.weight q4_0 q3_K"
check "Q3_K_L: attn_v and attn_output q5_K, ffn_down q5_K -> q5_1" \
    expect "$tmp/small.gguf" Q3_K_L "blk.4.attn_v.weight q5_K" "blk.4.attn_output.weight q5_K" \
    "blk.4.ffn_down.weight q5_1 q5_K" "blk.4.ffn_up.weight q3_K"
check "Q2_K: attn_v q3_K (fewer than 4 heads a KV head), attn_output q3_K, ffn_down q3_K -> q4_0" \
    expect "$tmp/small.gguf" Q2_K "blk.0.attn_v.weight q3_K" "blk.0.attn_output.weight q3_K" \
    "blk.0.ffn_down.weight q4_0 q3_K" "blk.0.attn_q.weight q2_K" "output.weight q6_K"
check "IQ4_XS: ffn_down of layer 0 q5_K -> q5_1 without an imatrix, others iq4_xs -> iq4_nl" \
    expect "$tmp/small.gguf" IQ4_XS "blk.0.ffn_down.weight q5_1 q5_K" \
    "blk.1.ffn_down.weight iq4_nl iq4_xs" "blk.1.attn_v.weight iq4_xs"
check "Q4_0: output q6_K, as llama-quantize; everything else q4_0" \
    expect "$tmp/small.gguf" Q4_0 "output.weight q6_K" "blk.0.ffn_down.weight q4_0" \
    "token_embd.weight q4_0"
check "Q8_0: output stays q8_0" expect "$tmp/small.gguf" Q8_0 "output.weight q8_0"
check "q4_k (any case) is llama-quantize's alias of Q4_K_M" \
    sh -c "'$tool' quantize --dry-run '$tmp/small.gguf' q4_k | grep -q '^plan: Q4_K (general.file_type 15)'"
check "--pure: every matrix in the type, attn_v and output too" \
    expect "$tmp/small.gguf" Q4_K_M --pure "blk.0.attn_v.weight q4_K" "output.weight q4_K" \
    "blk.0.ffn_down.weight q5_0 q4_K"
# tiny: rows of 128 and 352, so every k-quant falls back; the output rule gives q8_0 outright.
check "tiny Q4_K_M: all fall back (q4_K -> q5_0, q6_K -> q8_0), output q8_0" \
    expect "$tmp/tiny.gguf" Q4_K_M "blk.0.attn_q.weight q5_0 q4_K" \
    "blk.1.attn_v.weight q8_0 q6_K" "blk.1.ffn_down.weight q8_0 q6_K" \
    "blk.0.ffn_down.weight q5_0 q4_K" "output.weight q8_0" "token_embd.weight q5_0 q4_K"
check "F16: matrices f16, norms f32" \
    expect "$tmp/tiny.gguf" F16 "blk.0.attn_q.weight f16" "output.weight f16" "output_norm.weight f32"

# ---- Writing every type and mix ----------------------------------------------------------------
# Each output is read back by the GGUF reader (a plan over it, whose "from" column is what the
# file holds): every tensor as planned, the same keys plus file_type and quantization_version.
ftype_of() {
    case $1 in
    f32 | F32) echo 0 ;; f16 | F16) echo 1 ;; q4_0) echo 2 ;; q4_1) echo 3 ;; q8_0) echo 7 ;;
    q5_0) echo 8 ;; q5_1) echo 9 ;; q2_K | Q2_K) echo 10 ;; Q3_K_S) echo 11 ;;
    q3_K | Q3_K_M) echo 12 ;; Q3_K_L) echo 13 ;; Q4_K_S) echo 14 ;; q4_K | Q4_K_M) echo 15 ;;
    Q5_K_S) echo 16 ;; q5_K | Q5_K_M) echo 17 ;; q6_K | Q6_K) echo 18 ;; iq4_nl) echo 25 ;;
    iq4_xs) echo 30 ;; bf16) echo 32 ;;
    esac
}
keys_of() { "$tool" quantize --dry-run "$1" F32 | sed -n 's/^plan: .* \([0-9]*\) keys.*/\1/p'; }
# roundtrip IN TYPE [OPTIONS]: quantise IN to TYPE; a refusal must name a missing quantiser.
roundtrip() {
    in=$1 t=$2
    shift 2
    out="$tmp/out-$t.gguf"
    rm -f "$out"
    "$tool" quantize --dry-run "$@" "$in" "$t" >"$tmp/p-$t" || return 1
    missing=$(sed -n 's/^no quantizer://p' "$tmp/p-$t")
    "$tool" quantize "$@" "$in" "$out" "$t" >/dev/null 2>"$tmp/e-$t"
    rc=$?
    if [ -n "$missing" ]; then
        first=$(echo $missing | cut -d' ' -f1)
        test $rc -eq 1 && grep -q "there is no quantiser for $first" "$tmp/e-$t" && test ! -e "$out"
        return
    fi
    test $rc -eq 0 || return 1
    awk '$4 == "->" { print $1, $5 }' "$tmp/p-$t" >"$tmp/want-$t"
    "$tool" quantize --dry-run "$out" F32 >"$tmp/back-$t" || return 1
    awk '$4 == "->" { print $1, $3 }' "$tmp/back-$t" | diff "$tmp/want-$t" - >/dev/null || return 1
    grep -q "^plan: .* $(($(keys_of "$in") + 2)) keys, .*input general.file_type $(ftype_of "$t")\$" \
        "$tmp/back-$t"
}
for t in q4_0 q4_1 q5_0 q5_1 q8_0 q2_K q3_K q4_K q5_K q6_K iq4_nl iq4_xs f16 bf16 f32 \
    Q4_K_M Q4_K_S Q5_K_M Q5_K_S Q6_K Q3_K_M Q3_K_S Q3_K_L Q2_K; do
    check "tiny to $t: the planned types, the metadata, file_type (or the missing quantiser)" \
        roundtrip "$tmp/tiny.gguf" $t
done
# small has tensors the k-quants hold without falling back.
for t in Q4_K_M Q6_K Q3_K_S; do
    check "small to $t (k-quant tensors written, or the missing quantiser named)" \
        roundtrip "$tmp/small.gguf" $t
done
check "requantised tiny q8_0 gives the seeded q8_0 model's tokens" \
    sh -c "test \"\$('$tool' run --gguf '$tmp/out-q8_0.gguf' -n 8 -t 1 | grep '^tokens:')\" = \
                 \"\$('$tool' run --model tiny --wtype q8_0 -n 8 -t 1 | grep '^tokens:')\""
check "the q8_0 output quantised again to q4_0 (dequantised first) runs" \
    sh -c "'$tool' quantize '$tmp/out-q8_0.gguf' '$tmp/rq.gguf' q4_0 >/dev/null 2>&1 &&
           '$tool' run --gguf '$tmp/rq.gguf' -n 4 -t 1 | grep -q '^tokens:'"
check "-t 1 and -t 3 write the same file" \
    sh -c "'$tool' quantize --pure -t 1 '$tmp/small.gguf' '$tmp/t1.gguf' q4_0 >/dev/null 2>&1 &&
           '$tool' quantize --pure -t 3 '$tmp/small.gguf' '$tmp/t3.gguf' q4_0 >/dev/null 2>&1 &&
           cmp '$tmp/t1.gguf' '$tmp/t3.gguf'"
check "-t 0 exits 2" sh -c "'$tool' quantize -t 0 '$tmp/tiny.gguf' '$tmp/x.gguf' q4_0 2>/dev/null; test \$? -eq 2"
check "progress is one line per tensor on stderr" \
    sh -c "test \$(grep -c '^\[ *[0-9]*/  *21\] ' '$tmp/e-q8_0') -eq 21"

# ---- Importance matrices (llama.cpp's legacy .dat) --------------------------------------------
# i32 ENTRIES, then per entry i32 LEN, NAME, i32 NCALL, i32 NVAL, NVAL f32; then i32 last call,
# i32 LEN and the dataset's name.
le32() { printf "\\$(printf %03o $(($1 & 255)))\\$(printf %03o $((($1 >> 8) & 255)))\\000\\000"; }
ones() { i=0; while [ $i -lt $1 ]; do printf '\000\000\200\077'; i=$((i + 1)); done; }
entry() { le32 ${#1}; printf %s "$1"; le32 2; le32 $2; ones $2; }
{ le32 2; entry blk.0.attn_q.weight 128; entry blk.0.ffn_down.weight 352; le32 10; le32 4; printf data; } >"$tmp/im.dat"
{ le32 1; entry blk.0.attn_q.weight 64; } >"$tmp/im-narrow.dat"
{ le32 1; entry unrelated.weight 4; } >"$tmp/im-other.dat"
head -c 100 "$tmp/im.dat" >"$tmp/im-cut.dat"
check "an imatrix file is accepted" \
    sh -c "'$tool' quantize --imatrix '$tmp/im.dat' '$tmp/tiny.gguf' '$tmp/im.gguf' q4_0 >/dev/null 2>&1"
check "a truncated imatrix file is refused with exit 1 and one sentence" \
    sh -c "'$tool' quantize --imatrix '$tmp/im-cut.dat' '$tmp/tiny.gguf' '$tmp/x.gguf' q4_0 >/dev/null 2>'$tmp/e';
           test \$? -eq 1 && test \$(wc -l <'$tmp/e') -eq 1 &&
           grep -q 'is not a legacy llama.cpp importance matrix: an entry.s values are cut short' '$tmp/e' &&
           test ! -e '$tmp/x.gguf'"
check "an imatrix entry of the wrong width is refused" \
    sh -c "'$tool' quantize --imatrix '$tmp/im-narrow.dat' '$tmp/tiny.gguf' '$tmp/x.gguf' q4_0 >/dev/null 2>'$tmp/e';
           test \$? -eq 1 && grep -q \"the imatrix has 64 values for tensor 'blk.0.attn_q.weight', whose rows have 128\" '$tmp/e'"
check "a missing imatrix file is an error naming it" \
    sh -c "'$tool' quantize --imatrix '$tmp/none.dat' '$tmp/tiny.gguf' '$tmp/x.gguf' q4_0 2>&1 >/dev/null | grep -q \"cannot read imatrix file '$tmp/none.dat'\""
check "with an imatrix, Q4_0 guards the first eighth of ffn_down with q4_1 (llama.cpp)" \
    expect "$tmp/small.gguf" Q4_0 --imatrix "$tmp/im-other.dat" "blk.0.ffn_down.weight q4_1" \
    "blk.1.ffn_down.weight q4_0"

# ---- The seeded models' --wtype -----------------------------------------------------------------
check "--wtype q6_K on tiny falls back to q8_0 everywhere: q8_0's tokens" \
    sh -c "test \"\$('$tool' run --model tiny --wtype q6_K -n 8 -t 1 | grep '^tokens:')\" = \
                 \"\$('$tool' run --model tiny --wtype q8_0 -n 8 -t 1 | grep '^tokens:')\""
check "--wtype q4_K --save-gguf on tiny writes q5_0 matrices and f32 norms" \
    sh -c "'$tool' run --model tiny --wtype q4_K --save-gguf '$tmp/w.gguf' >/dev/null &&
           '$tool' quantize --dry-run '$tmp/w.gguf' F32 >'$tmp/w' &&
           grep -q '^blk.1.ffn_down.weight .* q5_0 *->' '$tmp/w' && grep -q '^output.weight .* q5_0 *->' '$tmp/w' &&
           grep -q '^blk.0.attn_norm.weight .* f32 *->' '$tmp/w'"
# small's 512-wide matrices hold q4_K when this build quantises it, else --wtype says why not.
wtype_small() {
    if "$tool" quantize --dry-run --pure "$tmp/small.gguf" q4_K | grep -q '^no quantizer:.* q4_K'; then
        "$tool" run --model small --wtype q4_K --save-gguf "$tmp/ws.gguf" 2>&1 >/dev/null |
            grep -q 'there is no quantiser for q4_K'
        return
    fi
    "$tool" run --model small --wtype q4_K --save-gguf "$tmp/ws.gguf" >/dev/null &&
        "$tool" quantize --dry-run "$tmp/ws.gguf" F32 >"$tmp/ws" &&
        grep -q '^blk.0.attn_q.weight .* q4_K *->' "$tmp/ws" &&
        grep -q '^blk.0.ffn_down.weight .* q5_0 *->' "$tmp/ws"
}
check "--wtype q4_K on small: q4_K where rows of 512 fit, ffn_down q5_0 (or no quantiser)" wtype_small
check "--wtype refuses the activation types: exit 2" \
    sh -c "'$tool' run --model tiny --wtype q8_1 2>/dev/null; test \$? -eq 2"

# ---- Errors -----------------------------------------------------------------------------------
check "an unknown type exits 2 with the usage" \
    sh -c "'$tool' quantize '$tmp/tiny.gguf' '$tmp/x.gguf' q7_K 2>'$tmp/e'; test \$? -eq 2 &&
           grep -q \"unknown type 'q7_K'\" '$tmp/e' && grep -q '^usage: backplane quantize' '$tmp/e'"
check "q8_K (an activation type) is not a file type: exit 2" \
    sh -c "'$tool' quantize '$tmp/tiny.gguf' '$tmp/x.gguf' q8_K 2>/dev/null; test \$? -eq 2"
check "a missing argument exits 2" sh -c "'$tool' quantize '$tmp/tiny.gguf' q4_0 2>/dev/null; test \$? -eq 2"
check "an unknown option exits 2" sh -c "'$tool' quantize --fast '$tmp/tiny.gguf' '$tmp/x.gguf' q4_0 2>/dev/null; test \$? -eq 2"
check "--imatrix without a value exits 2" sh -c "'$tool' quantize --imatrix 2>/dev/null; test \$? -eq 2"
check "an unreadable input exits 1 naming it" \
    sh -c "'$tool' quantize '$tmp/none.gguf' '$tmp/x.gguf' q4_0 2>'$tmp/e'; test \$? -eq 1 && grep -q 'none.gguf' '$tmp/e'"
check "a file that is not GGUF exits 1" \
    sh -c "printf 'not a model at all, no' >'$tmp/junk.gguf'; '$tool' quantize '$tmp/junk.gguf' '$tmp/x.gguf' q4_0 2>/dev/null; test \$? -eq 1"
check "--dry-run writes nothing" \
    sh -c "'$tool' quantize --dry-run '$tmp/tiny.gguf' '$tmp/dry.gguf' q4_0 >/dev/null && test ! -e '$tmp/dry.gguf'"
check "an output that cannot be written exits 1 with the reason" \
    sh -c "'$tool' quantize '$tmp/tiny.gguf' /nonexistent/x.gguf q4_0 2>&1 >/dev/null | grep -q '/nonexistent/x.gguf'"

echo "$pass passed, $fail failed"
test $fail -eq 0
