"""End-to-end kernels shared by every device: the same ASTs, opts and numpy oracle for CLANG, EMU and each plugin."""
