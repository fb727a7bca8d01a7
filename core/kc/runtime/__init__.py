"""Running kernels: the device registry and Buffers, the plugin manager, the compile cache and the argument checks of
a kernel call. The EMU device (the core's own numpy interpreter of linear UOps) is kc.emu, a layer above this one."""
