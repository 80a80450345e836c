// EPD_NO_FMA on a function: every product rounded to float before it is added, as ATen's separate
// operators round it (a product written to a tensor, then summed). -march=native lets GCC fuse a
// product into the sum after it (an FMA, one rounding fewer), which changes the last bit; the
// kernels that promise the library's bits compile those functions without that contraction.
#pragma once

#if defined(__clang__)
#pragma clang fp contract(off)
#define EPD_NO_FMA
#else
#define EPD_NO_FMA __attribute__((optimize("fp-contract=off")))
#endif
