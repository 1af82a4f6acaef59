#!/usr/bin/env bash
# Retrains the shipped models (models/codec-speech-16k, models/lm-speech-16k, models/lm-masked-speech-16k,
# models/lm-speech-conditioned-16k) with their recipes, on the built-in corpus (plus the voices corpus for
# the codec), on this machine's CPU: about three hours on 2 cores.
#   the codec    recipes/codec_source_filter.yaml (`rvqlm train-source-filter`; its settings in the recipe)
#   CODEC        1: train the codec and copy it into models/codec-speech-16k (the default); 0: keep the codec
#                in models/codec-speech-16k and retrain the LMs on its tokens
#   LM_STEPS     LM stage-1 steps (the shipped LM: 700)
#   LM_STEPS2    LM stage-2 steps (recipes/shipped/lm_speech_stage2.yaml, from the stage-1 LM; the shipped LM:
#                300; 0: none)
#   MASKED_STEPS the masked LM (recipes/lm_masked_speech.yaml, from the shipped AR LM: 1000, the
#                default; 0: none)
#   COND_STEPS   the text- and speaker-conditioned LM (recipes/lm_speech_conditioned.yaml, from the shipped
#                AR LM, on the corpus plus its espeak-ng voices: 1200, the default; 0: none)
# Training is reproducible up to float non-determinism across thread counts. A rerun starts each run folder
# over (--overwrite true): the script's runs are its own.
set -euo pipefail
cd "$(dirname "$0")/.."
LM_STEPS=${LM_STEPS:-700}
LM_STEPS2=${LM_STEPS2:-300}
MASKED_STEPS=${MASKED_STEPS:-1000}
COND_STEPS=${COND_STEPS:-1200}
CODEC=${CODEC:-1}
RVQLM=.venv/bin/rvqlm
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

$RVQLM corpus prepare fillets
if [ "$CODEC" = 1 ]; then
  bash scripts/system_deps.sh --voices
  $RVQLM corpus prepare voices
  $RVQLM train-source-filter recipes/codec_source_filter.yaml --threads "$OMP_NUM_THREADS"
  # The shipped folder also holds the card and figures: copy the weights in beside them.
  cp runs/codec-source-filter/pretrained/config.json runs/codec-source-filter/pretrained/model.safetensors \
      models/codec-speech-16k/
fi
fp=$(.venv/bin/python -c "from codec import Codec; print(Codec.from_pretrained('models/codec-speech-16k').token_fingerprint()[:12])")
tokens=data/tokens/fillets-cs-16k-$fp
$RVQLM tokenize data/fillets-cs-16k "$tokens" --codec models/codec-speech-16k
$RVQLM train-lm --config recipes/lm_speech.yaml --overwrite true --data.tokens_dir "$tokens" --trainer.max_steps "$LM_STEPS" \
    --model.total_steps "$LM_STEPS"
lm=runs/lm_speech/pretrained
if [ "$LM_STEPS2" -gt 0 ]; then
  $RVQLM train-lm --config recipes/lm_speech.yaml --config recipes/shipped/lm_speech_stage2.yaml --overwrite true --data.tokens_dir "$tokens" \
      --model.init_from "$lm" --trainer.max_steps "$LM_STEPS2" --model.total_steps "$LM_STEPS2"
  lm=runs/lm_speech_stage2/pretrained
fi
rm -rf runs/shipped-lm
$RVQLM export-lm "$lm" runs/shipped-lm --dtype float16
cp runs/shipped-lm/config.json runs/shipped-lm/model.safetensors models/lm-speech-16k/
$RVQLM eval-lm --lm models/lm-speech-16k --tokens "$tokens" --split valid --unigram
if [ "$MASKED_STEPS" -gt 0 ]; then
  $RVQLM train-lm --config recipes/lm_masked_speech.yaml --overwrite true --data.tokens_dir "$tokens" \
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
  OMP_NUM_THREADS=2 $RVQLM train-lm --config recipes/lm_speech.yaml --config recipes/lm_speech_conditioned.yaml --overwrite true \
      --data.tokens_dir "$synth_tokens" --trainer.max_steps "$COND_STEPS" --model.total_steps "$COND_STEPS"
  rm -rf runs/shipped-conditioned-lm
  $RVQLM export-lm runs/lm_speech_conditioned/pretrained runs/shipped-conditioned-lm --dtype float16
  mkdir -p models/lm-speech-conditioned-16k
  cp runs/shipped-conditioned-lm/config.json runs/shipped-conditioned-lm/model.safetensors models/lm-speech-conditioned-16k/
fi
