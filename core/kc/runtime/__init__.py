"""Running kernels: the device registry and Buffers, the plugin manager, the compile cache, the argument checks of
a kernel call, and the EMU device (the core's own numpy interpreter of linear UOps)."""
