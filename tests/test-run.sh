#!/bin/sh
# test-run.sh - `backplane run` (the main job): the tiny model on the CPU, on the test
# accelerator plus the CPU, and on Meta(CPU0,CPU1) (with the CPU collectives and with the generic
# butterfly) must generate the same tokens as the CPU alone, with logits within tolerance; its
# outputs (--json, --dot) and errors. Run by make check.
set -u
tool="${top_builddir:-.}/tools/backplane"
cpu="$BP_TEST_CPU_PLUGIN_DIR" accel="$BP_TEST_ACCEL_PLUGIN_DIR" meta="$BP_TEST_META_PLUGIN_DIR"
example="$BP_TEST_EXAMPLE_PLUGIN_DIR"
export BP_PLUGIN_PATH="$cpu:$accel:$meta:$example" BP_PLUGIN_SYSTEM_PATH= BP_LOG_LEVEL=none
. "$(dirname "$0")/check.sh"
# agrees DEVICES [extra options]: --check passes, and the largest logit difference is small.
agrees() {
    d=$1
    shift
    out=$("$tool" run --model tiny -p 12 -n 10 -t 1 -d "$d" --check "$@") || { echo "$out"; return 1; }
    echo "$out"
    echo "$out" | grep -q "check: .*tokens agree" || return 1
    diff=$(echo "$out" | sed -n 's/.*largest logit difference \([^ ]*\) over.*/\1/p')
    awk -v d="$diff" 'BEGIN { exit !(d != "" && d + 0 < 1e-3) }'
}
# (called as `test-run.sh --agrees ...` so that an environment can be set for one check)
if [ "${1:-}" = --agrees ]; then
    shift
    agrees "$@"
    exit $?
fi

check "tiny on the CPU equals itself, exactly" sh -c "'$tool' run --model tiny -p 12 -n 10 --check | grep -q 'tokens agree; largest logit difference 0 over 10 steps'"
check "two runs give the same tokens" sh -c "test \"\$('$tool' run -n 6 | grep tokens:)\" = \"\$('$tool' run -n 6 -t 1 | grep tokens:)\""
check "accelerator + CPU agrees with the CPU" agrees "ACCEL0,CPU"
check "q8_0 on the accelerator: logits within the q8_0 bound, NMSE reported" sh -c "'$tool' run --model tiny -n 8 --wtype q8_0 -d ACCEL0,CPU --check | grep -q 'NMSE [0-9.e-]* (bound 2e-03): pass'"
check "--json reports the check's NMSE and verdict" sh -c "'$tool' run --model tiny -n 3 --wtype bf16 -d ACCEL0,CPU --check --json | grep -q '\"nmse_bound\": 1e-06, \"pass\": true'"
check "the KV cache and embedding go where SET_ROWS and GET_ROWS run" sh -c "'$tool' run -d ACCEL0 -n 2 | grep -q 'weights [0-9.]* MiB on ACCEL0 (TestAccel), token embedding on CPU, KV cache [0-9.]* MiB on CPU'"
long_name=$(printf 'CPU%0300d' 0)
check "a device name longer than any buffer is named whole in the error" sh -c "'$tool' run -d '$long_name' -n 2 2>&1 | grep -q \"device '$long_name': \""
check "a Meta(...) part list longer than any buffer reaches the meta plugin whole" env BP_CPU_DEVICES=2 sh -c "'$tool' run -d 'Meta(CPU0,$long_name)' -n 2 2>&1 | grep -q '$long_name'"
check "an empty name in -d is named as such" sh -c "'$tool' run -d 'CPU,,CPU' 2>&1 | grep -q 'a name is empty'"
check "unbalanced parentheses in -d are named as such" sh -c "'$tool' run -d 'Meta(CPU0,CPU' 2>&1 | grep -q 'parentheses do not match'"
check "json says where the KV cache and embedding live" sh -c "'$tool' run -d ACCEL0 -n 2 --json | grep -q '\"embedding_on\": \"CPU\"' && '$tool' run -d ACCEL0 -n 2 --json | grep -q '\"kv_cache_on\": \"CPU\"'"
check "the accelerator run has several splits" sh -c "'$tool' run -d ACCEL0 -n 3 | grep -q 'generation: 2 tokens, [0-9][0-9]* splits per graph: CPU 1 nodes, ACCEL0'"
check "Meta(CPU0,CPU1) agrees (collectives)" env BP_CPU_DEVICES=2 "$0" --agrees "Meta(CPU0,CPU1)"
check "Meta(CPU0,CPU1) agrees (butterfly)" env BP_CPU_DEVICES=2 BP_META_NO_COMM=1 "$0" --agrees "Meta(CPU0,CPU1)"
check "Meta(CPU0,CPU1) stores the matrices split: each part holds under 70 % of the weights" env BP_CPU_DEVICES=2 sh -c "'$tool' run -d 'Meta(CPU0,CPU1)' -n 2 | sed -n 's/.*weights \([0-9.]*\) MiB and KV.*per part: \([0-9.]*\) + \([0-9.]*\) MiB.*/\1 \2 \3/p' | awk '{ exit !(NF == 3 && \$2 < 0.7 * \$1 && \$3 < 0.7 * \$1) }'"
# The parts of a meta device store their Q4_0/Q8_0 slices in the CPU's repacked layout, as the
# CPU alone stores its weights, or both plainly with --no-repack. The two layouts' kernels round
# differently (the activations are requantised at every product), so the logits of a meta
# device that did not repack would differ from the repacking reference by a few hundredths,
# beyond what this check allows.
check "Meta(CPU0,CPU1,CPU2) agrees, q8_0 weights repacked in the parts" env BP_CPU_DEVICES=3 "$0" --agrees "Meta(CPU0,CPU1,CPU2)" --wtype q8_0
check "Meta(CPU0,CPU1) agrees, q4_0 weights repacked in the parts" env BP_CPU_DEVICES=2 "$0" --agrees "Meta(CPU0,CPU1)" --wtype q4_0
check "Meta(CPU0,CPU1,CPU2) agrees, q8_0 weights, --no-repack" env BP_CPU_DEVICES=3 "$0" --agrees "Meta(CPU0,CPU1,CPU2)" --wtype q8_0 --no-repack
check "the example plugin (examples/) loads and serves the model with the CPU" agrees "EXAMPLE0"
check "the asynchronous example plugin (examples/async/) serves the model with the CPU, exactly" env BP_PLUGIN_PATH="$BP_PLUGIN_PATH:$BP_TEST_ASYNC_PLUGIN_DIR" sh -c "'$tool' run --model tiny -p 12 -n 10 -t 1 -d ASYNC0 --check | grep -q 'tokens agree; largest logit difference 0 over 10 steps'"
check "the example plugin runs the element-wise ops" sh -c "'$tool' run -d EXAMPLE0 -n 2 | grep -q 'splits per graph: .*EXAMPLE0'"
check "json reports the check" sh -c "'$tool' run -n 4 --check --json | grep -q '\"check\": {\"tokens_agree\": true'"
if command -v python3 >/dev/null 2>&1; then
    check "json parses" sh -c "'$tool' run -n 4 --json | python3 -m json.tool"
fi
check "--dot writes the scheduled graph" sh -c "'$tool' run -d ACCEL0 -n 2 --dot '$tmp/g.dot' && grep -q '^digraph' '$tmp/g.dot' && grep -q cluster '$tmp/g.dot'"
check "an unknown device is named with the ones that exist" sh -c "'$tool' run -d GPU7 2>&1; test \$? -eq 1" 
check "the unknown device message lists devices" sh -c "'$tool' run -d GPU7 2>&1 | grep -q \"device 'GPU7': .*devices: .*CPU\""
check "q4_0 weights on the CPU are repacked (CPU_REPACK), --no-repack keeps host memory" sh -c "'$tool' run --wtype q4_0 -n 2 | grep -q 'on CPU (CPU_REPACK)' && '$tool' run --wtype q4_0 -n 2 --no-repack | grep -q 'on CPU (Host)'"
check "repacked and host q4_0 weights generate the same tokens" sh -c "test \"\$('$tool' run --wtype q4_0 -p 12 -n 10 | grep tokens:)\" = \"\$('$tool' run --wtype q4_0 -p 12 -n 10 --no-repack | grep tokens:)\""
check "q8_0 weights are repacked too, with the same tokens as in host memory" sh -c "'$tool' run --wtype q8_0 -n 2 | grep -q 'on CPU (CPU_REPACK)' && test \"\$('$tool' run --wtype q8_0 -p 12 -n 10 | grep tokens:)\" = \"\$('$tool' run --wtype q8_0 -p 12 -n 10 --no-repack | grep tokens:)\""
check "a weight type the device cannot run, with the ones it can" sh -c "'$tool' run -d ACCEL0 --wtype q4_0 2>&1 | grep -q 'ACCEL0 cannot run q4_0 weights; it can run: f32, f16, bf16, q8_0'"
check "a model larger than the device's memory" sh -c "'$tool' run -d ACCEL0 --model base 2>&1 | grep -q \"model 'base' with f32 weights needs .* GiB for weights and KV cache; ACCEL0 has\""
check "an unknown model exits 2 with the names" sh -c "'$tool' run --model huge 2>&1 | grep -q 'models: tiny, small, base'; '$tool' run --model huge 2>/dev/null; test \$? -eq 2"
check "a prompt longer than the context is refused" sh -c "'$tool' run -p 300 2>&1 | grep -q 'context of'"
check "the CPU must come last (a usage error)" sh -c "'$tool' run -d CPU,ACCEL0 >/dev/null 2>'$tmp/e'; test \$? -eq 2 && grep -q 'must come last' '$tmp/e' && { BP_CPU_DEVICES=2 '$tool' run -d CPU0,CPU1 >/dev/null 2>'$tmp/e'; test \$? -eq 2; } && grep -q \"'CPU0' must come last in -d (one CPU device finishes every graph)\" '$tmp/e'"
check "a device listed twice is named as such" sh -c "'$tool' run -d CPU,CPU 2>&1 | grep -q \"lists the device 'CPU' twice\" && { '$tool' run -d CPU,CPU 2>/dev/null; test \$? -eq 2; }"
check "a device listed under two names is named as such" env BP_CPU_DEVICES=2 sh -c "'$tool' run -d ACCEL0,CPU,CPU0 2>&1 | grep -q \"lists the device 'CPU0' twice (as 'CPU' and 'CPU0')\""
# usage VALUE-ERROR-REGEX COMMAND...: exit status 2 and the message on stderr, nothing run.
usage() {
    want=$1
    shift
    "$@" >"$tmp/stdout" 2>"$tmp/stderr"
    rc=$?
    cat "$tmp/stderr"
    test "$rc" -eq 2 && grep -q -- "$want" "$tmp/stderr" && test ! -s "$tmp/stdout"
}
# A meta name of the wrong form is a usage error (exit 2), said by the meta plugin; a device
# that is not there is exit 1.
check "an empty Meta() is a usage error" usage "'Meta()' names no devices" env BP_CPU_DEVICES=2 "$tool" run -d 'Meta()' -n 2
check "an empty part in Meta(...) is a usage error" usage "device 2 of 'Meta(CPU0,)' is empty" env BP_CPU_DEVICES=2 "$tool" run -d 'Meta(CPU0,)' -n 2
check "a nested Meta(...) is a usage error that says so" usage "a meta device cannot be a part of another" env BP_CPU_DEVICES=2 "$tool" run -d 'Meta(Meta(CPU0,CPU1),CPU0)' -n 2
check "a part named twice in Meta(...) is a usage error" usage "listed twice" env BP_CPU_DEVICES=2 "$tool" run -d 'Meta(CPU0,CPU0)' -n 2
check "a missing device is exit 1, and the meta registry says how its devices are made" sh -c "'$tool' run -d NOPE0 -n 2 >/dev/null 2>'$tmp/e'; test \$? -eq 1 && grep -q \"no device is named 'NOPE0'\" '$tmp/e' && grep -q 'a meta device is made when a program names one' '$tmp/e'"
# Every numeric option is parsed whole and range-checked.
for bad in "-t abc" "-t 2x" "-t -1" "-t 1025" "--threads ' 4'" "-p abc" "-p 0" "-p 9999999999" "-n ''" "-n +5" "-n 1e3"; do
    opt=${bad%% *}
    check "run $bad is refused" usage "^backplane run: $opt needs a whole number from" sh -c "exec '$tool' run -n 2 $bad"
done
for bad in "abc" "-1" "18446744073709551616" "0x10" "1.5"; do
    check "run --seed $bad is refused" usage "^backplane run: --seed needs a whole number from 0 to 18446744073709551615, not '$bad'" "$tool" run -n 2 --seed "$bad"
done
check "the largest seed is accepted" sh -c "'$tool' run -n 2 --seed 18446744073709551615 | grep -q 'seed 18446744073709551615'"
check "-p and -n that overflow int are refused with the context" usage "^backplane run: -p 2147483647 and -n 2 do not fit the context of 'tiny': -p + -n - 1 must be at most 256" "$tool" run -p 2147483647 -n 2
check "-n that overflows int with -p is refused" usage "do not fit the context" "$tool" run -p 2 -n 2147483647
check "-p + -n - 1 equal to the context is accepted" sh -c "'$tool' run -p 250 -n 7 -t 1 | grep -q '^tokens:'"
# (each after small sizes, so that a broken parser runs a short benchmark, not the default)
small="--M 64 --K 64 --N 1 --types f32 --min-time 0.01 --no-limits -d CPU"
for bad in "--M abc" "--M 0" "--K 0" "--K 64x" "--N 1,,2" "--N 1,x" "--N 1,2,3,4,5,6,7,8,9" "-t abc" "--min-time abc" "--min-time nan" "--min-time inf" "--min-time 0" "--min-time -1"; do
    opt=${bad%% *}
    check "bench $bad is refused" usage "^backplane bench: $opt needs" sh -c "exec '$tool' bench $small $bad"
done
check "bench refuses an unknown option" usage "unknown option '--frob'" sh -c "exec '$tool' bench $small --frob 1"
check "bench refuses an unknown type before running" usage "'f33' in --types is not a weight type" sh -c "exec '$tool' bench $small --types f32,f33"
# --dot: a file that cannot be written is an error, not a warning
check "--dot to a missing directory exits 1 before running" sh -c "'$tool' run -n 2 --dot /nonexistent/x.dot > '$tmp/o' 2> '$tmp/e'; test \$? -eq 1 && grep -q \"cannot write --dot file '/nonexistent/x.dot'\" '$tmp/e' && test ! -s '$tmp/o'"
# a write that fails half-way: the file size limit (the tool ignores SIGXFSZ, so the write
# fails with EFBIG instead of killing it)
check "--dot that cannot be written to the end exits 1" sh -c "(ulimit -f 1; exec '$tool' run -n 2 --dot '$tmp/big.dot') >/dev/null 2>'$tmp/e'; test \$? -eq 1 && grep -q \"cannot write the graph to $tmp/big.dot: .*write failed\" '$tmp/e'"
if [ -w /dev/full ]; then
    check "run output to a full disk exits 1" sh -c "'$tool' run -n 2 --json >/dev/full 2>/dev/null; test \$? -eq 1"
fi
# Files named on the command line are opened without blocking. Outputs may be regular files or
# streams (a FIFO something reads, /dev/null); a FIFO that nothing reads (a blocking open would
# hang) or a directory is refused at once with what it is. Inputs must be regular files.
# timeout turns a hang into a failure.
mkfifo "$tmp/fifo"
for opt in --dot --logits; do
    check "$opt to a FIFO nothing reads is refused at once" sh -c "timeout 20 '$tool' run -n 2 $opt '$tmp/fifo' >/dev/null 2>'$tmp/e'; test \$? -eq 1 && grep -qF \"cannot write $opt file '$tmp/fifo': it is a FIFO that nothing reads\" '$tmp/e'"
    check "$opt to a directory is refused at once" sh -c "timeout 20 '$tool' run -n 2 $opt '$tmp' >/dev/null 2>'$tmp/e'; test \$? -eq 1 && grep -qF \"cannot write $opt file '$tmp': it is a directory, not a file or stream\" '$tmp/e'"
    check "$opt to /dev/null is written" sh -c "timeout 60 '$tool' run -n 2 $opt /dev/null >/dev/null"
    # The shell opens the FIFO read-write first, so a reader exists before the tool opens it.
    check "$opt to a FIFO with a reader is written" sh -c "exec 3<>'$tmp/fifo'; cat <&3 >'$tmp/fifo.out' & c=\$!; exec 3>&-; timeout 60 '$tool' run -n 2 $opt '$tmp/fifo' >/dev/null; r=\$?; sleep 1; kill \$c; test \$r -eq 0 && test -s '$tmp/fifo.out'"
done
for bad in "$tmp/fifo:a FIFO" "/dev/null:a character device" "$tmp:a directory"; do
    path=${bad%%:*} kind=${bad#*:}
    check "--gguf of $kind is refused at once" sh -c "timeout 20 '$tool' run --gguf '$path' >'$tmp/o' 2>'$tmp/e'; test \$? -eq 1 && grep -qF \"GGUF file $path is $kind, not a regular file\" '$tmp/e' && test ! -s '$tmp/o'"
    check "--save-gguf to $kind is refused at once" sh -c "timeout 20 '$tool' run --model tiny --save-gguf '$path' >/dev/null 2>'$tmp/e'; test \$? -eq 1 && grep -qF \"GGUF file $path is $kind; only a regular file is replaced\" '$tmp/e'"
done
test -p "$tmp/fifo" || echo "FAIL: the FIFO was replaced"

check "--dot without a generation step is refused" usage "needs -n 2 or more" "$tool" run -n 1 --dot "$tmp/g1.dot"
check "--dot and --logits naming one file are refused" usage "name the same file '$tmp/same'" "$tool" run -n 2 --dot "$tmp/same" --logits "$tmp/same"
check "--dot and --logits naming one file by a link are refused" sh -c ": > '$tmp/one' && ln -sf '$tmp/one' '$tmp/two' && '$tool' run -n 2 --dot '$tmp/one' --logits '$tmp/two' >/dev/null 2>&1; test \$? -eq 2"
check "--dot and --logits may both be /dev/null" sh -c "'$tool' run -n 2 --dot /dev/null --logits /dev/null >/dev/null"
# backplane bench: the same benchmarks on the chosen devices
check "bench measures matmul and add on the CPU" sh -c "'$tool' bench -d CPU --M 64 --K 64 --N 1,3 --types f32,q4_0 --min-time 0.01 --no-limits > '$tmp/b' && grep -q '^mul_mat_q4_0 M=64,K=64,N=3 CPU [0-9.]* GFLOP/s' '$tmp/b' && grep -q '^mul_mat_f32_weight_bw M=64,K=64,N=1 CPU' '$tmp/b' && grep -q '^add n=16777216 CPU [0-9.]* GB/s' '$tmp/b'"
check "bench measures repacked q4_0 on the CPU and skips it elsewhere" sh -c "'$tool' bench -d ACCEL0,CPU --M 64 --K 64 --N 1 --types q4_0_repack --min-time 0.01 --no-limits > '$tmp/b' && grep -q '^mul_mat_q4_0_repack M=64,K=64,N=1 CPU [0-9.]* GFLOP/s' '$tmp/b' && grep -q 'mul_mat_q4_0_repack on ACCEL0: no CPU_REPACK buffer type, skipped' '$tmp/b'"
check "bench measures the new weight types on the CPU" sh -c "'$tool' bench -d CPU --M 64 --K 64 --N 1,3 --types q4_1,q5_0,q5_1 --min-time 0.01 --no-limits > '$tmp/b' && grep -q '^mul_mat_q4_1 M=64,K=64,N=3 CPU [0-9.]* GFLOP/s' '$tmp/b' && grep -q '^mul_mat_q5_1_weight_bw M=64,K=64,N=1 CPU' '$tmp/b'"
check "bench ends with the peak resident size" sh -c "'$tool' bench -d CPU --M 64 --K 64 --N 1 --types f32 --min-time 0.01 --no-limits | tail -1 | grep -q '^peak_rss host [0-9.]* MiB$'"
check "bench refuses a type the runtime cannot quantise to" usage "'i32' in --types is not a weight type the runtime can quantise to" sh -c "exec '$tool' bench $small --types i32"
check "bench refuses a K that is not a multiple of a type's block" usage "^backplane bench: --K needs a multiple of 256 for q4_k (its block size), not 64" sh -c "exec '$tool' bench $small --types f32,q4_k"
check "bench measures the super-block types on the CPU" sh -c "'$tool' bench -d CPU --M 16 --K 256 --N 1,3 --types q2_k,q3_k,q4_k,q5_k,q6_k,iq4_xs,iq4_nl --min-time 0.01 --no-limits > '$tmp/b' && test \$(grep -c '^mul_mat_[a-z0-9_]* M=16,K=256,N=3 CPU [0-9.]* GFLOP/s' '$tmp/b') -eq 7"
check "bench skips what a device cannot do" sh -c "'$tool' bench -d ACCEL0 --M 64 --K 64 --N 1 --types q4_0 --min-time 0.01 --no-limits | grep -q 'mul_mat_q4_0 on ACCEL0: not supported, skipped'"
check "bench refuses a K that is not a multiple of 32" sh -c "'$tool' bench --K 33 2>&1 | grep -q 'multiple of 32'"
# Attention fused (FLASH_ATTN_EXT, the default where the KV cache's device runs it) or not:
# the same tokens, logits within float rounding
check "--flash-attn on and off generate the same tokens" sh -c "test \"\$('$tool' run --model tiny -n 8 -t 1 --flash-attn on | grep '^tokens:')\" = \"\$('$tool' run --model tiny -n 8 -t 1 --flash-attn off | grep '^tokens:')\""
check "the CPU fuses attention by default, and says so" sh -c "'$tool' run --model tiny -n 2 | grep -q '^attention:  fused (FLASH_ATTN_EXT)' && '$tool' run --model tiny -n 2 --flash-attn off | grep -q '^attention:  MUL_MAT, SOFT_MAX, MUL_MAT' && '$tool' run --model tiny -n 2 --json | grep -q '\"flash_attn\": true'"
check "fused attention on Meta(CPU0,CPU1) agrees with the CPU" env BP_CPU_DEVICES=2 "$0" --agrees "Meta(CPU0,CPU1)" --flash-attn on
check "--flash-attn takes on, off or auto" usage "takes on, off or auto, not 'yes'" "$tool" run --flash-attn yes
# A q8_0 KV cache (fused attention reads it): about half the bytes, and it runs on the CPU and
# on Meta(CPU0,CPU1) like the CPU alone
check "--kv-type q8_0 keeps the cache in q8_0 and agrees with the CPU" sh -c "'$tool' run --model tiny -n 8 --kv-type q8_0 --check > '$tmp/q' && grep -q '^attention:  fused (FLASH_ATTN_EXT), q8_0 KV cache' '$tmp/q' && grep -q 'KV cache 0.13 MiB' '$tmp/q' && grep -q 'check: .*pass' '$tmp/q'"
check "--kv-type q8_0 on Meta(CPU0,CPU1) agrees with the CPU" env BP_CPU_DEVICES=2 sh -c "'$tool' run --model tiny -n 6 -d 'Meta(CPU0,CPU1)' --kv-type q8_0 --check | grep -q 'check: .*pass'"
check "--kv-type q8_0 without fused attention is refused" usage "needs --flash-attn on or auto" "$tool" run --kv-type q8_0 --flash-attn off
check "--kv-type takes llama.cpp's cache types" usage "takes f16, q8_0, q4_0, q4_1, q5_0, q5_1 or iq4_nl, not 'q4_k'" "$tool" run --kv-type q4_k
for kv in q4_0 q4_1 q5_0 q5_1 iq4_nl; do
    check "--kv-type $kv keeps the cache in $kv and agrees with the CPU" sh -c "'$tool' run --model tiny -n 6 --kv-type $kv --check > '$tmp/q' && grep -q '^attention:  fused (FLASH_ATTN_EXT), $kv KV cache' '$tmp/q' && grep -q 'check: .*pass' '$tmp/q'"
done
check "--kv-type iq4_nl on Meta(CPU0,CPU1) agrees with the CPU" env BP_CPU_DEVICES=2 sh -c "'$tool' run --model tiny -n 6 -d 'Meta(CPU0,CPU1)' --kv-type iq4_nl --check | grep -q 'check: .*pass'"
check "--kv-type q4_1 without fused attention is refused" usage "q4_1 needs --flash-attn on or auto" "$tool" run --kv-type q4_1 --flash-attn off
check "--precision takes full or half" usage "takes full or half, not 'quarter'" "$tool" run --precision quarter
check "--precision half: bf16 on the accelerator (full precision) agrees within 2e-3, reported" sh -c "'$tool' run --model tiny -n 6 --wtype bf16 -d ACCEL0,CPU --precision half --check --json | grep -q '\"matmul_precision\": \"half\"' && '$tool' run --model tiny -n 6 --wtype bf16 -d ACCEL0,CPU --precision half --check | grep -q 'NMSE [0-9.e-]* (bound 2e-03): pass'"
# GGUF files: --save-gguf writes the seeded models as llama files (q and k rows reordered for
# llama's rope), and --gguf serves them with the same tokens and logits
for w in f32 q8_0; do
    check "--save-gguf then --gguf: the same tokens as the seeded tiny model ($w)" sh -c "'$tool' run --model tiny --wtype $w --save-gguf '$tmp/tiny-$w.gguf' > /dev/null && test \"\$('$tool' run --model tiny --wtype $w -n 8 -t 1 | grep '^tokens:')\" = \"\$('$tool' run --gguf '$tmp/tiny-$w.gguf' -n 8 -t 1 | grep '^tokens:')\""
done
check "a saved f32 GGUF is used in place in its mapping on the CPU, a q8_0 one repacked" sh -c "'$tool' run --gguf '$tmp/tiny-f32.gguf' -n 2 | grep -q 'on CPU (Host, in place in the mapped file)' && '$tool' run --gguf '$tmp/tiny-q8_0.gguf' -n 2 | grep -q 'on CPU (CPU_REPACK)' && '$tool' run --gguf '$tmp/tiny-q8_0.gguf' -n 2 --no-repack | grep -q 'in place in the mapped file'"
check "--gguf with --model, and --tokens with -p, are refused" sh -c "'$tool' run --gguf '$tmp/tiny-f32.gguf' --model tiny 2>&1 | grep -q -- '--model does not apply' && '$tool' run --tokens 1,2 -p 4 2>&1 | grep -q -- '-p does not apply'"
check "--tokens takes plain digits only" usage "token 2 ('+5') is not an id" "$tool" run --tokens 1,+5
check "a saved GGUF on the accelerator agrees with the CPU" sh -c "'$tool' run --gguf '$tmp/tiny-f32.gguf' -n 6 -d ACCEL0,CPU --check | grep -q 'check: .*tokens agree.*pass'"
# --save-gguf replaces the file: a run serving the old one keeps it (a new inode), the target's
# permissions stay, and a link is written through; a write cut short leaves the old file whole
check "--save-gguf replaces a file: new inode, same permissions, a link followed" sh -c "cp '$tmp/tiny-f32.gguf' '$tmp/r.gguf' && chmod 640 '$tmp/r.gguf' && ln -s r.gguf '$tmp/link.gguf' && old=\$(stat -c %i '$tmp/r.gguf') && '$tool' run --model tiny --wtype q8_0 --save-gguf '$tmp/link.gguf' > /dev/null && test -L '$tmp/link.gguf' && test \$(stat -c %a '$tmp/r.gguf') = 640 && test \$(stat -c %i '$tmp/r.gguf') != \$old && cmp -s '$tmp/r.gguf' '$tmp/tiny-q8_0.gguf'"
check "--save-gguf cut short leaves the old file and no temporary" sh -c "mkdir '$tmp/cut' && cp '$tmp/tiny-f32.gguf' '$tmp/cut/m.gguf' && (ulimit -f 64; exec '$tool' run --model tiny --save-gguf '$tmp/cut/m.gguf') >/dev/null 2>'$tmp/e'; test \$? -eq 1 && grep -q 'File too large' '$tmp/e' && cmp -s '$tmp/cut/m.gguf' '$tmp/tiny-f32.gguf' && test \"\$(ls -A '$tmp/cut')\" = m.gguf"
long=$(printf 'a%.0s' $(seq 1 250)).gguf
check "--save-gguf replaces a file whose name is 255 bytes long" sh -c "'$tool' run --model tiny --save-gguf '$tmp/cut/$long' >/dev/null && '$tool' run --model tiny --save-gguf '$tmp/cut/$long' >/dev/null && cd '$tmp/cut' && test \"\$(ls -A | wc -l)\" -eq 2"
check "--save-gguf to a missing directory fails with the reason" sh -c "'$tool' run --model tiny --save-gguf /nonexistent/x.gguf 2>&1 >/dev/null | grep -q \"cannot write '/nonexistent/x.gguf'\""
# Files written by the GGUF project's Python package (tests/gguf/make-models.py): the tokens of
# an independent numpy forward pass, from token ids given with --tokens
gguf_dir="$(dirname "$0")/gguf"
while read -r file prompt want; do
    case "$file" in "#"*) continue ;; esac
    check "--gguf $file generates what the numpy reference does" sh -c "test \"\$('$tool' run --gguf '$gguf_dir/$file' --tokens $prompt -n 8 -t 1 | sed -n 's/^tokens: *//p')\" = '$want'"
    check "--gguf $file agrees with the CPU on the accelerator and on Meta(CPU0,CPU1)" sh -c "'$tool' run --gguf '$gguf_dir/$file' --tokens $prompt -n 8 -d ACCEL0,CPU --check | grep -q 'pass\$' && BP_CPU_DEVICES=2 '$tool' run --gguf '$gguf_dir/$file' --tokens $prompt -n 8 -d 'Meta(CPU0,CPU1)' --check | grep -q 'pass\$'"
done < "$gguf_dir/models.txt"
while read -r file says; do
    case "$file" in "#"*) continue ;; esac
    check "--gguf refuses $file: $says" sh -c "'$tool' run --gguf '$gguf_dir/$file' -p 4 -n 2 > '$tmp/o' 2> '$tmp/e'; test \$? -eq 1 && grep -qF \"$says\" '$tmp/e' && test ! -s '$tmp/o'"
done < "$gguf_dir/bad-models.txt"
check "--gguf of a file that is not GGUF names the file" sh -c "'$tool' run --gguf '$0' 2>&1 | grep -q 'test-run.sh'"
check "--gguf of a GGUF file without a model says what it lacks" sh -c "'$tool' run --gguf '$gguf_dir/reference.gguf' 2>&1 | grep -q 'no llama.block_count'"
check "--gguf with --wtype is refused" usage "does not apply" "$tool" run --gguf "$gguf_dir/llama-gqa.gguf" --wtype f16
check "--tokens outside the vocabulary is refused" usage "token 2 ('96') is not an id in \[0, 96)" "$tool" run --gguf "$gguf_dir/llama-gqa.gguf" --tokens 1,96
check "--tokens that are not numbers are refused" usage "token 1 ('x') is not an id" "$tool" run --tokens x,1
check "--tokens longer than the context is refused" usage "do not fit the context" "$tool" run --gguf "$gguf_dir/llama-gqa.gguf" --ctx 4 --tokens 1,2,3,4,5
# mixture of experts: the router, MUL_MAT_ID and the weighted sum, on the CPU and across a meta device
check "moe on Meta(CPU0,CPU1): each part holds half of every expert's rows, agrees with the CPU" env BP_CPU_DEVICES=2 sh -c "'$tool' run --model moe -p 6 -n 4 --wtype f16 -d 'Meta(CPU0,CPU1)' --check > '$tmp/mm' && grep -q 'experts: .*33.00 MiB on Meta(CPU0,CPU1) (Meta(CPU0,CPU1)); per part: 16.50 + 16.50 MiB' '$tmp/mm' && grep -q 'check: .*NMSE .*pass' '$tmp/mm' && '$tool' run --model moe -p 6 -n 4 --wtype q8_0 -d 'Meta(CPU0,CPU1)' --check | grep -q 'check: .*pass'"
check "moe --save-gguf then --gguf: the same tokens (q4_0)" sh -c "'$tool' run --model moe --wtype q4_0 --save-gguf '$tmp/moe.gguf' > /dev/null && test \"\$('$tool' run --model moe --wtype q4_0 -n 6 -t 1 | grep '^tokens:')\" = \"\$('$tool' run --gguf '$tmp/moe.gguf' -n 6 -t 1 | grep '^tokens:')\""
check "moe with its experts on the CPU, MUL_MAT_ID on the accelerator: a quarter copied, agrees" sh -c "'$tool' run --model moe -n 4 -d ACCEL0,CPU --experts-on CPU --check > '$tmp/m' && grep -q 'experts: .*66.00 MiB on CPU (Host); copied per generated token: 16.5[0-9][0-9] MiB of experts (the ones used; whole tensors: 66.000 MiB)' '$tmp/m' && grep -q 'check: .*pass' '$tmp/m'"
check "moe --expert-copies all copies the whole stacked experts" sh -c "'$tool' run --model moe -n 3 -d ACCEL0,CPU --experts-on CPU --expert-copies all --json | grep -q '\"expert_bytes_copied_per_token\": 69206016,'"
# A weight device without MUL_MAT_ID: the experts' products run where --experts-on puts them
check "moe with weights on a device without MUL_MAT_ID and experts on the CPU runs and agrees" env BP_TEST_ACCEL_NO_OP=MUL_MAT_ID sh -c "'$tool' run --model moe -n 3 -d ACCEL0,CPU --experts-on CPU --check > '$tmp/mn' && grep -q 'weights .* on ACCEL0' '$tmp/mn' && grep -q 'experts: .* on CPU' '$tmp/mn' && grep -q 'check: .*pass' '$tmp/mn'"
check "moe with its experts on a device without MUL_MAT_ID is refused, naming the way out" env BP_TEST_ACCEL_NO_OP=MUL_MAT_ID sh -c "'$tool' run --model moe -n 3 -d ACCEL0,CPU 2>&1 >/dev/null | grep -q 'ACCEL0 cannot run MUL_MAT_ID of f32 weights.*--experts-on'"
check "--experts-on names a device of the run, for a model with experts" sh -c "'$tool' run --model moe -n 2 --experts-on NOPE 2>&1 | grep -q \"'NOPE', which is not one of the devices\" && '$tool' run --model tiny --experts-on CPU 2>&1 | grep -q 'has none'"
check "moe --expert-cache 8 holds every expert after the first steps: hits, fewer bytes, agrees" sh -c "'$tool' run --model moe -n 8 -d ACCEL0,CPU --experts-on CPU --expert-cache 8 --check > '$tmp/mc' && grep -q 'cache of 8 per tensor: [0-9]* hits, [0-9]* misses' '$tmp/mc' && grep -q 'check: .*pass' '$tmp/mc' && '$tool' run --model moe -n 8 -d ACCEL0,CPU --experts-on CPU --expert-cache 8 --json | grep -q '\"expert_cache\": 8,'"
check "moe q4_0 on Meta(CPU0,CPU1) checks against the CPU in the same layout, and passes" env BP_CPU_DEVICES=2 sh -c "'$tool' run --model moe --wtype q4_0 -n 4 --seed 1 -d 'Meta(CPU0,CPU1)' --check | grep -q 'check: .*pass'"
check "the expert options are refused for a model without experts" usage "--expert-cache applies to a model with experts; 'tiny' has none" "$tool" run --model tiny --expert-cache 2
check "--experts-on matches device names in any case and lists them when it does not" sh -c "'$tool' run --model moe -n 2 -d ACCEL0,CPU --experts-on cpu | grep -q 'experts: .*on CPU (Host)' && '$tool' run --model moe -n 2 --experts-on nope 2>&1 | grep -q 'not one of the devices of this run: CPU'"
check "moe experts left in the GGUF file (--experts-on file): read as used, cached, agrees" sh -c "'$tool' run --model moe --wtype q8_0 --save-gguf '$tmp/moe-q8.gguf' > /dev/null && '$tool' run --gguf '$tmp/moe-q8.gguf' -n 6 --experts-on file --expert-cache 4 --check > '$tmp/mf' && grep -q 'experts: .*17.53 MiB in the file (File); copied per generated token: .*cache of 4 per tensor: [0-9]* hits' '$tmp/mf' && grep -q 'check: .*pass' '$tmp/mf'"
check "--experts-on file keeps the other weights mapped in place and checks like for like" sh -c "'$tool' run --model moe --wtype f16 --save-gguf '$tmp/moe-f16.gguf' > /dev/null && '$tool' run --gguf '$tmp/moe-f16.gguf' -n 4 --experts-on file --check > '$tmp/mg' && grep -q 'on CPU (Host, in place in the mapped file)' '$tmp/mg' && grep -q 'in the file (File);' '$tmp/mg' && grep -q 'NMSE 0 (bound' '$tmp/mg'"
check "--experts-on file needs --gguf" usage "--experts-on file leaves the experts in the --gguf file" "$tool" run --model moe --experts-on file
check "--expert-cache takes a count" usage "--expert-cache needs a whole number from 0 to 4096" "$tool" run --expert-cache -1
check "--expert-copies takes used or all" usage "--expert-copies is used or all, not 'some'" "$tool" run --expert-copies some
check "moe --expert-cache 2 prefetches the predicted experts on a copy thread and agrees" sh -c "'$tool' run --model moe -n 8 -d ACCEL0,CPU --experts-on CPU --expert-cache 2 --check > '$tmp/mp' && grep -q 'prefetch: [1-9][0-9]* experts loaded ahead (.* MiB per generated token of those copied), [0-9]* of them used; per generated token .* ms copying' '$tmp/mp' && grep -q 'check: .*pass' '$tmp/mp' && '$tool' run --model moe -n 4 -d ACCEL0,CPU --experts-on CPU --expert-cache 2 --expert-prefetch off --json | grep -q '\"expert_prefetch\": false,'"
check "--expert-prefetch takes on or off" usage "--expert-prefetch is on or off, not 'maybe'" "$tool" run --expert-prefetch maybe
check "--expert-prefetch on needs an expert cache" usage "--expert-prefetch on loads predicted experts into the expert cache" "$tool" run --model moe --expert-prefetch on
check "--expert-cache does not go with --expert-copies all" usage "it does not go with --expert-copies all" "$tool" run --model moe --expert-copies all --expert-cache 2
check "a cache with the experts where the products run predicts nothing" sh -c "'$tool' run --model moe -n 3 --expert-cache 2 --json | grep -q '\"expert_prefetch\": false,'"
check "--no-expert-stream does not go with a cache" usage "--no-expert-stream copies whole stacked experts, without a cache or prefetch; it does not go with --expert-cache" "$tool" run --model moe --no-expert-stream --expert-cache 2
check "--no-expert-stream copies whole stacked experts" sh -c "'$tool' run --model moe -n 3 -d ACCEL0,CPU --experts-on CPU --no-expert-stream --json | grep -q '\"expert_bytes_copied_per_token\": 69206016,' && '$tool' run --model tiny --no-expert-stream 2>&1 | grep -q 'no-expert-stream applies to a model with experts'"
check "--repeat 3 warms up, times three passes and generates the same tokens" sh -c "test \"\$('$tool' run --model tiny -n 6 -t 1 --repeat 3 | tee '$tmp/r' | grep '^tokens:')\" = \"\$('$tool' run --model tiny -n 6 -t 1 | grep '^tokens:')\" && grep -q 'median of the passes after the warm-up' '$tmp/r' && grep -q '^load: .* ms loading the weights; first prompt pass [0-9.]* ms; peak RSS [0-9.]* MiB' '$tmp/r'"
check "--json reports --repeat, load and first-pass time and peak RSS" sh -c "'$tool' run --model tiny -n 3 --repeat 2 --json > '$tmp/j' && grep -q '\"repeat\": 2,' '$tmp/j' && grep -q '\"load_seconds\": [0-9]' '$tmp/j' && grep -q '\"first_prompt_seconds\": [0-9]' '$tmp/j' && grep -q '\"peak_rss_bytes\": [1-9][0-9]\{6,\},' '$tmp/j'"
check "--repeat 0 is refused" usage "^backplane run: --repeat needs" sh -c "exec '$tool' run --model tiny --repeat 0"
check "--logits writes n_gen x n_vocab f32" sh -c "'$tool' run --model tiny -n 3 --logits '$tmp/l.bin' > /dev/null && test \$(wc -c < '$tmp/l.bin') -eq 12288"
check "--logits to a missing directory exits 1 with the reason" sh -c "'$tool' run --model tiny -n 2 --logits /nonexistent/l.bin 2>&1 >/dev/null | grep -q \"cannot write --logits file '/nonexistent/l.bin'\""
check "every CPU case passes with graphs run on the calling thread alone (the pool's contention mode)" env BP_CPU_FORCE_SOLO=1 sh -c "'$tool' conformance CPU -t 2 | grep -q '^CPU: [0-9]* passed, 0 failed, 0 not supported'"
check "the tiny model with the pool's contention mode gives the same tokens" sh -c "test \"\$(BP_CPU_FORCE_SOLO=1 '$tool' run --model tiny -n 8 -t 2 | grep '^tokens:')\" = \"\$('$tool' run --model tiny -n 8 -t 2 | grep '^tokens:')\""
# backplane conformance: the suite as an installed command, on any device
check "conformance passes on the CPU, every case claimed" sh -c "'$tool' conformance CPU > '$tmp/c' && grep -q '^CPU: [0-9]* passed, 0 failed, 0 not supported' '$tmp/c' && grep -q '^  flash_attn_ext  *ok   9/9 passed' '$tmp/c'"
check "conformance on Meta(CPU0,CPU1) and the test accelerator passes what each supports" env BP_CPU_DEVICES=2 sh -c "'$tool' conformance 'Meta(CPU0,CPU1)' ACCEL0 --ops flash_attn_ext,mul_mat,soft_max,rope > '$tmp/c' && grep -q '^Meta(CPU0,CPU1): [0-9]* passed, 0 failed, 0 not supported' '$tmp/c' && grep -q '^ACCEL0: [0-9]* passed, 0 failed, [1-9][0-9]* not supported' '$tmp/c'"
check "conformance runs a third-party plugin's device (the example plugin)" env BP_PLUGIN_PATH="$BP_PLUGIN_PATH:$example" sh -c "'$tool' conformance EXAMPLE0 --ops add,unary | grep -q '^EXAMPLE0: [1-9][0-9]* passed, 0 failed'"
check "conformance runs the asynchronous example plugin's device (through its queue)" env BP_PLUGIN_PATH="$BP_PLUGIN_PATH:$BP_TEST_ASYNC_PLUGIN_DIR" sh -c "'$tool' conformance ASYNC0 --ops add,mul,scale | grep -q '^ASYNC0: [1-9][0-9]* passed, 0 failed'"
check "conformance fails (exit 1) on a device with a wrong kernel, naming the case" env BP_TEST_ACCEL_WRONG_OP=MUL_MAT sh -c "'$tool' conformance ACCEL0 --ops mul_mat_f32,add > '$tmp/c'; test \$? -eq 1 && grep -q 'mul_mat_f32  *FAIL 0/18 passed, 18 FAILED: mul_mat_f32\\[0\\]: NMSE' '$tmp/c' && grep -q '^  add  *ok ' '$tmp/c'"
check "conformance says a plugin failed to read a result back, not an NMSE of garbage" env BP_PLUGIN_PATH="$BP_PLUGIN_PATH:$BP_TEST_LIAR_PLUGIN_DIR" BP_TEST_LIE=get-tensor-fails sh -c "'$tool' conformance LIAR0 --ops add > '$tmp/c'; test \$? -eq 1 && grep -q '^  add  *FAIL 0/[0-9]* passed, [0-9]* FAILED: add\\[0\\]: the plugin failed to read the tensor back (BP_ERR_BACKEND): TestAccel: reading [0-9]* bytes back failed' '$tmp/c' && ! grep -q NMSE '$tmp/c'"
check "conformance --json reports per case and in total" sh -c "'$tool' conformance CPU --ops glu --json | grep -q '\"case\": \"glu\", \"variants\": 9, \"passed\": 9, \"failed\": 0, \"not_supported\": 0'"
check "conformance --list names every case" sh -c "'$tool' conformance --list | grep -q '^flash_attn_ext  *9 variants'"
check "conformance --list --ops lists the cases selected" sh -c "test \"\$('$tool' conformance --list --ops mul_mat_id,add | cut -d' ' -f1 | tr '\n' ' ')\" = 'add mul_mat_id mul_mat_id_quant mul_mat_id_q4_1_q5_iq4_nl mul_mat_id_kquant '"
check "conformance --list --json is one JSON object" sh -c "'$tool' conformance --list --json --ops glu | python3 -c 'import json,sys; d=json.load(sys.stdin); assert d == {\"cases\": [{\"name\": \"glu\", \"variants\": 9, \"max_nmse\": 1e-09}]}, d'"
check "conformance --list refuses device names" usage "it takes no device names" "$tool" conformance --list NOSUCH
check "conformance --list refuses -t" usage "it takes no -t" "$tool" conformance --list -t 2
check "conformance --list checks --ops" usage "'nope' names no case" "$tool" conformance --list --ops nope
check "conformance --ops naming no case is refused" usage "'nope' names no case" "$tool" conformance CPU --ops add,nope
check "conformance --ops empty is refused" usage "--ops is empty" "$tool" conformance CPU --ops ""
check "conformance -t takes a thread count" usage "-t needs" "$tool" conformance CPU -t x
check "conformance of an unknown device fails with its name" sh -c "'$tool' conformance NOPE 2>&1 >/dev/null | grep -q \"device 'NOPE'\""
echo "$pass passed, $fail failed"
test "$fail" -eq 0
