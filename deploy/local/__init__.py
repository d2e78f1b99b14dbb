"""Floor 2: what deployctl keeps and decides on the local machine (issue 25): local state files, the run
history, the benchmark datasets and the throughput gate's statistics."""
