"""NPU Console host agent: runs on each accelerator host; never imports Django."""
