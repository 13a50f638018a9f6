"""Tools around a run: `pcl plan` (GPU memory against a cluster) and the batch-size probe."""
