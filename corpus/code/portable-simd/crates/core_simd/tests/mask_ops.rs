#![feature(portable_simd)]

mod mask_ops_impl;
