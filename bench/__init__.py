"""pldjax's benchmark suite: ``python -m bench --list``; see bench/README.md."""
