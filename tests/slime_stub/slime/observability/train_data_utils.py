"""Stand-in for slime.observability.train_data_utils: the payload --save-debug-train-data writes (format 2).

Only the payload builder: slime's writer gathers the DP shards with Megatron first, which the tests replace by
handing the shards in directly.
"""

import torch

# Per-rank schedule fields, kept in dp_shards; whole-batch fields, stored once at the top.
_LAYOUT_FIELDS = ("micro_batch_indices", "num_microbatches", "global_batch_sizes")
_WHOLE_BATCH_FIELDS = ("raw_reward",)
# Per-sample id columns, each surfaced on the sample under its own name.
_ID_COLUMNS = {"sample_indices": "sample_index", "partition": "rollout_position"}


def _per_sample(value, count: int) -> bool:
    if torch.is_tensor(value):
        return value.dim() >= 1 and value.size(0) == count
    return isinstance(value, (list, tuple)) and len(value) == count


def _build_dump_payload(dp_shards, *, rollout_id, writer_rank):
    """One dict per training sample, ordered by its position in the rollout dump (else its sample index), plus
    each shard's layout and the whole-batch fields."""
    samples, layout, whole_batch = [], [], {}
    for shard in dp_shards:
        data = shard["rollout_data"]
        count = len(data["response_lengths"])
        shard_layout = {"rank": shard["rank"], "data_parallel_rank": shard["data_parallel_rank"]}
        for column in _ID_COLUMNS:
            shard_layout[column] = list(data[column]) if data.get(column) is not None else None
        columns = {}
        for key, value in data.items():
            if key in _ID_COLUMNS:
                continue
            if key in _WHOLE_BATCH_FIELDS:
                whole_batch.setdefault(key, value)
            elif key in _LAYOUT_FIELDS or not _per_sample(value, count):
                shard_layout[key] = value
            else:
                columns[key] = value
        for i in range(count):
            sample = {"data_parallel_rank": shard["data_parallel_rank"]}
            for column, name in _ID_COLUMNS.items():
                if data.get(column) is not None:
                    sample[name] = data[column][i]
            sample.update({key: column[i] for key, column in columns.items()})
            samples.append(sample)
        layout.append(shard_layout)
    for key in ("rollout_position", "sample_index"):
        if samples and all(sample.get(key) is not None for sample in samples):
            samples.sort(key=lambda sample, key=key: sample[key])
            break
    return {
        "format_version": 2,
        "rollout_id": rollout_id,
        "rank": writer_rank,
        "samples": samples,
        "dp_shards": layout,
        **whole_batch,
    }
