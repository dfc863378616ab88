"""What slime does with a batch of finished samples: GRPO group advantages, search metrics in its logs."""
