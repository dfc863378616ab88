"""Stand-in for slime.rollout.data_source: the data buffer slime's rollouts draw prompt groups from and put unfinished
groups back into (RolloutDataSourceWithBuffer). As in slime: the buffer is served first (pop_first, or
--buffer-filter-path), then fresh prompts, each sample of a group a deep copy of its prompt with the next
group_index and index; add_samples takes only whole groups of n_samples_per_prompt. The stand-in reads no data file:
`dataset` is None (slime's blank Sample() per prompt, as with no --prompt-data) unless a test sets it to an object
with `samples` and a length, which is all slime's get_samples reads of its Dataset."""

import abc
import copy

from slime.utils.misc import load_function
from slime.utils.types import Sample


class DataSource(abc.ABC):
    @abc.abstractmethod
    def get_samples(self, num_samples: int) -> list[list[Sample]]:
        """Return num_samples groups."""

    @abc.abstractmethod
    def add_samples(self, samples: list[list[Sample]]):
        """Add groups to the data source."""


class RolloutDataSource(DataSource):
    def __init__(self, args):
        self.args = args
        self.epoch_id = 0
        self.sample_group_index = 0
        self.sample_index = 0
        self.sample_offset = 0
        self.metadata = {}
        if args.rollout_global_dataset and args.prompt_data is not None:
            raise NotImplementedError("the stand-in of slime reads no data files: set `dataset` instead")
        self.dataset = None

    def get_samples(self, num_samples):
        if self.dataset is not None:
            if self.sample_offset + num_samples <= len(self.dataset):
                prompt_samples = self.dataset.samples[self.sample_offset : self.sample_offset + num_samples]
                self.sample_offset += num_samples
            else:  # the epoch ends: wrap around (slime reshuffles here with --rollout-shuffle)
                prompt_samples = self.dataset.samples[self.sample_offset :]
                num_samples -= len(prompt_samples)
                self.epoch_id += 1
                prompt_samples += self.dataset.samples[:num_samples]
                self.sample_offset = num_samples
        else:
            prompt_samples = [Sample() for _ in range(num_samples)]
        samples = []
        for prompt_sample in prompt_samples:
            group = []
            for _ in range(self.args.n_samples_per_prompt):
                sample = copy.deepcopy(prompt_sample)
                sample.group_index = self.sample_group_index
                sample.index = self.sample_index
                self.sample_index += 1
                group.append(sample)
            self.sample_group_index += 1
            samples.append(group)
        return samples

    def add_samples(self, samples: list[list[Sample]]):
        raise RuntimeError(f"Cannot add samples to {self.__class__.__name__}. This is a read-only data source.")

    def __len__(self) -> int:
        return 0 if self.dataset is None else len(self.dataset)


class RolloutDataSourceWithBuffer(RolloutDataSource):
    def __init__(self, args):
        super().__init__(args)
        self.buffer = []
        self.buffer_filter = pop_first if args.buffer_filter_path is None else load_function(args.buffer_filter_path)

    def get_samples(self, num_samples: int) -> list[list[Sample]]:
        samples = self._get_samples_from_buffer(num_samples)
        num_samples -= len(samples)
        if num_samples == 0:
            return samples
        return samples + super().get_samples(num_samples=num_samples)

    def _get_samples_from_buffer(self, num_samples: int) -> list[list[Sample]]:
        if len(self.buffer) == 0 or num_samples == 0:
            return []
        return self.buffer_filter(self.args, None, self.buffer, num_samples)

    def add_samples(self, samples: list[list[Sample]]):
        if not samples:
            return
        assert isinstance(samples, list), f"samples must be a list, got {type(samples)}"
        assert isinstance(samples[0], list), f"the elements of samples must be list, got {type(samples[0])}"
        for group in samples:
            assert len(group) == self.args.n_samples_per_prompt, (
                "the length of the elements of samples must be equal to n_samples_per_prompt, "
                f"got {len(group)} != {self.args.n_samples_per_prompt}"
            )
            self.buffer.append(group)

    def get_buffer_length(self):
        return len(self.buffer)


def pop_first(args, rollout_id, buffer: list[list[Sample]], num_samples: int) -> list[list[Sample]]:
    num_to_pop = min(len(buffer), num_samples)
    samples = buffer[:num_to_pop]
    del buffer[:num_to_pop]
    return samples
