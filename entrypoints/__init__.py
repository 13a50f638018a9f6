"""Entry points: the `pcl` command, the training driver, experiments, and placing the actors of a run (the top layer:
it imports actors, services and pcl; nothing imports it)."""
