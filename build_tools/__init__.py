"""What the build runs around the kernel sources, kept out of ``kernel_src`` so that editing it does not change the
sources a compile runs from (``reproducible_compile``)."""
