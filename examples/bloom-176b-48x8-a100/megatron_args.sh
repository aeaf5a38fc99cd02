# shellcheck shell=bash
# Megatron-DeepSpeed (bigscience fork) arguments for bloom-176b, written by plantune.
# Vocabulary: --pad-vocab-size-to 250880, the model's own rows: a converted checkpoint loads as is.
# pretrain_gpt.py arguments plantune decided; ds_config.json is relative to this folder.
# Use: source megatron_args.sh && python pretrain_gpt.py "${MEGATRON_ARGS[@]}" <data, tokenizer, checkpoint, lr args>
MEGATRON_ARGS=(
    --num-layers 70
    --hidden-size 14336
    --ffn-hidden-size 57344
    --num-attention-heads 112
    --seq-length 2048
    --max-position-embeddings 2048
    --init-method-std 0.004822
    --pad-vocab-size-to 250880
    --position-embedding-type alibi
    --embed-layernorm
    --tensor-model-parallel-size 4
    --pipeline-model-parallel-size 12
    --micro-batch-size 2
    --global-batch-size 2048
    --rampup-batch-size 192 16 9765625
    --train-samples 178710938
    --optimizer adam
    --clip-grad 1.0
    --lr 6e-05
    --min-lr 6e-06
    --lr-decay-style cosine
    --lr-warmup-samples 183106
    --bf16
    --checkpoint-activations
    --deepspeed
    --deepspeed_config ds_config.json
    --zero-stage 0
    --deepspeed-activation-checkpointing
)
