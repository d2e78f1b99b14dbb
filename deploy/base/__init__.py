"""Floor 0: pure leaves every other floor may use (errors and exit codes, size/time limits, shell quoting,
terminal sanitising, signal handling). They import nothing of deployctl's."""
