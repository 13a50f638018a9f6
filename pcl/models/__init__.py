"""The sharded models: the policy learner, the value model, FSDP2 helpers, export in Hugging Face format."""
