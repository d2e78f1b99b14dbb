"""Files that run on the GPU host: standalone, standard library only."""
