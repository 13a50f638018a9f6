"""Experiment trackers: the run's figures to TensorBoard, wandb, MLflow or trackio."""
