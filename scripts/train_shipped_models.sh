#!/usr/bin/env bash
# Retrains the shipped models (models/codec-speech-16k, models/lm-speech-16k, models/lm-masked-speech-16k,
# models/lm-speech-conditioned-16k) with their recipes,
# on the built-in corpus, on this machine's CPU: hours on 2 cores. The codec's seven stages
# (docs/experiments.md), each from the previous one's export:
#   CODEC_STEPS  stage 1, recipes/shipped/codec_speech_istft.yaml (the shipped codec: 17000)
#   CODEC_STEPS2 stage 2, a 40 ms-window decoder on stage 1's tokens (codec_speech_long_window.yaml: 2500)
#   CODEC_STEPS3 stage 3, the whole codec (codec_speech_long_window_joint.yaml: 5000, then resumed for a
#                second lr cycle to step 9000; 0: stop after stage 1 and ship it); stages 4-7 follow,
#                layered over stage 3's recipe: codec_speech_cycle.yaml (6000 steps),
#                codec_speech_speed.yaml (5000), codec_speech_loudness_decoder.yaml (3000, tokens kept),
#                codec_speech_loudness_cycle.yaml (4000, new tokens), codec_speech_voices.yaml (3000, on
#                the built-in corpus plus the voices corpus, `rvqlm corpus prepare voices`; new tokens)
#   LM_STEPS     LM stage-1 steps (the shipped LM: see models/lm-speech-16k/MODEL_CARD.md)
#   LM_STEPS2    LM stage-2 steps (recipes/shipped/lm_speech_stage2.yaml, from the stage-1 LM; the shipped LM:
#                300; 0: none)
#   MASKED_STEPS the masked LM (recipes/lm_masked_speech.yaml, from the shipped AR LM: 1000, the
#                default; 0: none)
#   COND_STEPS   the text- and speaker-conditioned LM (recipes/lm_speech_conditioned.yaml, from the shipped
#                AR LM, on the corpus plus its espeak-ng voices: 1200, the default; 0: none)
# Training is reproducible up to float non-determinism across thread counts.
set -euo pipefail
cd "$(dirname "$0")/.."
CODEC_STEPS=${CODEC_STEPS:?set CODEC_STEPS}
CODEC_STEPS2=${CODEC_STEPS2:-2500}
CODEC_STEPS3=${CODEC_STEPS3:-5000}
LM_STEPS=${LM_STEPS:?set LM_STEPS}
LM_STEPS2=${LM_STEPS2:-0}
MASKED_STEPS=${MASKED_STEPS:-1000}
COND_STEPS=${COND_STEPS:-1200}
RVQLM=.venv/bin/rvqlm
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

last_run() { ls -d "runs/$1"/version_* | sort -V | tail -1; }

$RVQLM corpus prepare fillets
$RVQLM train-codec --config recipes/shipped/codec_speech_istft.yaml --trainer.max_steps "$CODEC_STEPS" --trainer.max_time null
if [ "$CODEC_STEPS3" -gt 0 ]; then
  $RVQLM export-codec "$(last_run codec_speech_istft)/checkpoints/last.ckpt" runs/codec_speech_istft/export
  $RVQLM train-codec --config recipes/shipped/codec_speech_long_window.yaml --trainer.max_steps "$CODEC_STEPS2"
  $RVQLM export-codec "$(last_run codec_speech_long_window)/checkpoints/last.ckpt" runs/codec_speech_long_window/stage1
  $RVQLM train-codec --config recipes/shipped/codec_speech_long_window_joint.yaml --trainer.max_steps "$CODEC_STEPS3"
  joint=$(last_run codec_speech_long_window_joint)
  $RVQLM train-codec --config recipes/shipped/codec_speech_long_window_joint.yaml --trainer.max_steps 9000 \
      --model.optim.decay_start 7500 --model.optim.decay_steps 1500 --ckpt_path "$joint/checkpoints/last.ckpt"
  $RVQLM export-codec "$(last_run codec_speech_long_window_joint)/checkpoints/last.ckpt" runs/codec_speech_long_window_joint/stage3
  $RVQLM train-codec --config recipes/shipped/codec_speech_long_window_joint.yaml --config recipes/shipped/codec_speech_cycle.yaml
  # Stage 5 started from stage 4 as shipped, its decoder stored as float16.
  $RVQLM export-codec "$(last_run codec_speech_cycle)/checkpoints/last.ckpt" runs/codec_speech_cycle/export \
      --dtype float16
  $RVQLM train-codec --config recipes/shipped/codec_speech_long_window_joint.yaml --config recipes/shipped/codec_speech_cycle.yaml \
      --config recipes/shipped/codec_speech_speed.yaml
  # Stage 6 started from stage 5 as shipped, its decoder stored as float16.
  $RVQLM export-codec "$(last_run codec_speech_speed)/checkpoints/last.ckpt" runs/codec_speech_speed/export \
      --dtype float16
  $RVQLM train-codec --config recipes/shipped/codec_speech_long_window_joint.yaml --config recipes/shipped/codec_speech_cycle.yaml \
      --config recipes/shipped/codec_speech_speed.yaml --config recipes/shipped/codec_speech_loudness_decoder.yaml
  # Stage 7 started from stage 6 as shipped, its decoder stored as float16.
  $RVQLM export-codec "$(last_run codec_speech_loudness_decoder)/checkpoints/last.ckpt" \
      runs/codec_speech_loudness_decoder/export --dtype float16
  $RVQLM train-codec --config recipes/shipped/codec_speech_long_window_joint.yaml --config recipes/shipped/codec_speech_cycle.yaml \
      --config recipes/shipped/codec_speech_speed.yaml --config recipes/shipped/codec_speech_loudness_cycle.yaml
  # Stage 8 started from stage 7 as shipped, its decoder stored as float16, on more voices.
  $RVQLM export-codec "$(last_run codec_speech_loudness_cycle)/checkpoints/last.ckpt" \
      runs/codec_speech_loudness_cycle/export --dtype float16
  bash scripts/system_deps.sh --voices
  $RVQLM corpus prepare voices
  $RVQLM train-codec --config recipes/shipped/codec_speech_long_window_joint.yaml --config recipes/shipped/codec_speech_cycle.yaml \
      --config recipes/shipped/codec_speech_speed.yaml --config recipes/shipped/codec_speech_loudness_cycle.yaml \
      --config recipes/shipped/codec_speech_voices.yaml
  final="$(last_run codec_speech_voices)/checkpoints/last.ckpt"
else
  final="$(last_run codec_speech_istft)/checkpoints/last.ckpt"
fi
# The shipped folder also holds the card and figures: write the weights beside it, then copy them in.
rm -rf runs/shipped-codec
$RVQLM export-codec "$final" runs/shipped-codec --dtype float16
cp runs/shipped-codec/config.json runs/shipped-codec/model.safetensors models/codec-speech-16k/
fp=$(.venv/bin/python -c "from codec import Codec; print(Codec.from_pretrained('models/codec-speech-16k').token_fingerprint()[:12])")
tokens=data/tokens/fillets-cs-16k-$fp
$RVQLM tokenize data/fillets-cs-16k "$tokens" --codec models/codec-speech-16k
$RVQLM train-lm --config recipes/lm_speech.yaml --data.tokens_dir "$tokens" --trainer.max_steps "$LM_STEPS" \
    --model.total_steps "$LM_STEPS"
lm=runs/lm_speech/pretrained
if [ "$LM_STEPS2" -gt 0 ]; then
  $RVQLM train-lm --config recipes/lm_speech.yaml --config recipes/shipped/lm_speech_stage2.yaml --data.tokens_dir "$tokens" \
      --model.init_from "$lm" --trainer.max_steps "$LM_STEPS2" --model.total_steps "$LM_STEPS2"
  lm=runs/lm_speech_stage2/pretrained
fi
rm -rf runs/shipped-lm
$RVQLM export-lm "$lm" runs/shipped-lm --dtype float16
cp runs/shipped-lm/config.json runs/shipped-lm/model.safetensors models/lm-speech-16k/
$RVQLM eval-lm --lm models/lm-speech-16k --tokens "$tokens" --split valid --unigram
if [ "$MASKED_STEPS" -gt 0 ]; then
  $RVQLM train-lm --config recipes/lm_masked_speech.yaml --data.tokens_dir "$tokens" \
      --trainer.max_steps "$MASKED_STEPS" --model.total_steps "$MASKED_STEPS"
  rm -rf runs/shipped-masked-lm
  $RVQLM export-lm runs/lm_masked_speech/pretrained runs/shipped-masked-lm --dtype float16
  mkdir -p models/lm-masked-speech-16k
  cp runs/shipped-masked-lm/config.json runs/shipped-masked-lm/model.safetensors models/lm-masked-speech-16k/
  $RVQLM eval-lm --lm models/lm-masked-speech-16k --tokens "$tokens" --split valid
fi
if [ "$COND_STEPS" -gt 0 ]; then
  $RVQLM corpus prepare synthetic
  synth_tokens=data/tokens/fillets-synth-cs-16k-$fp
  $RVQLM tokenize data/fillets-synth-cs-16k "$synth_tokens" --codec models/codec-speech-16k
  OMP_NUM_THREADS=2 $RVQLM train-lm --config recipes/lm_speech.yaml --config recipes/lm_speech_conditioned.yaml \
      --data.tokens_dir "$synth_tokens" --trainer.max_steps "$COND_STEPS" --model.total_steps "$COND_STEPS"
  rm -rf runs/shipped-conditioned-lm
  $RVQLM export-lm runs/lm_speech_conditioned/pretrained runs/shipped-conditioned-lm --dtype float16
  mkdir -p models/lm-speech-conditioned-16k
  cp runs/shipped-conditioned-lm/config.json runs/shipped-conditioned-lm/model.safetensors models/lm-speech-conditioned-16k/
fi
