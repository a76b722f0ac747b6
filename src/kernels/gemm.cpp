// Register-tiled float products for AVX-512 (see gemm.hpp): no packing of the weight matrix.
#include "gradflow/gemm.hpp"

#include <algorithm>
#include <stdexcept>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace gradflow {

#if defined(__AVX512F__)
namespace {
constexpr int kTileRows = 8;      // rows of the broadcast operand per tile
constexpr int kTileColumns = 32;  // two vectors of the streamed operand per tile

// sum_p x[r, p] y[p, 0 .. 32) over p in [0, k), for R rows of x and the columns of y that
// `low`/`high` select; handed to store(r, lanes 0-15, lanes 16-31). x[r, p] is x[r * ldx + p], or
// x[p * ldx + r] with XColumns (x stored transposed); y[p, j] is y[p * ldy + j].
// 8 x 2 accumulators: each step loads two vectors of y and broadcasts R scalars of x into 2 R
// fused multiply-adds, so the loads keep up with the FMA pipes, and y's 32-column strip (k x 128
// bytes) stays in cache across the row tiles. The sums live in registers only: __m512 may alias
// float, so an accumulator array that outlives the loop would be stored back after every step.
template <int R, bool Masked, bool XColumns, typename Store>
inline void tile_sums_of(const float* x, Eigen::Index ldx, const float* y, Eigen::Index ldy, Eigen::Index k,
                         __mmask16 low, __mmask16 high, Store& store) {
  __m512 sum0[R], sum1[R];
  for (int r = 0; r < R; ++r) sum0[r] = sum1[r] = _mm512_setzero_ps();
  for (Eigen::Index p = 0; p < k; ++p) {
    __m512 y0, y1;
    if constexpr (Masked) {
      y0 = _mm512_maskz_loadu_ps(low, y + p * ldy);
      y1 = _mm512_maskz_loadu_ps(high, y + p * ldy + 16);
    } else {
      y0 = _mm512_loadu_ps(y + p * ldy);
      y1 = _mm512_loadu_ps(y + p * ldy + 16);
    }
    for (int r = 0; r < R; ++r) {
      const __m512 xr = _mm512_set1_ps(XColumns ? x[p * ldx + r] : x[r * ldx + p]);
      sum0[r] = _mm512_fmadd_ps(xr, y0, sum0[r]);
      sum1[r] = _mm512_fmadd_ps(xr, y1, sum1[r]);
    }
  }
  for (int r = 0; r < R; ++r) store(r, sum0[r], sum1[r]);
}

// Whole strips load without masks: GCC keeps the sums in memory as well around a masked load.
template <int R, bool XColumns = false, typename Store>
inline void tile_sums(const float* x, Eigen::Index ldx, const float* y, Eigen::Index ldy, Eigen::Index k,
                      __mmask16 low, __mmask16 high, Store&& store) {
  if (low == 0xFFFF && high == 0xFFFF) {
    tile_sums_of<R, false, XColumns>(x, ldx, y, ldy, k, low, high, store);
  } else {
    tile_sums_of<R, true, XColumns>(x, ldx, y, ldy, k, low, high, store);
  }
}

__mmask16 lane_mask(Eigen::Index lanes) {
  return lanes >= 16 ? __mmask16(0xFFFF) : lanes <= 0 ? __mmask16(0) : __mmask16((1u << lanes) - 1u);
}

// C[m0 .. m0 + R, n0 .. n0 + 32) (+)= A B: x = A's rows (or, with AColumns, A^T's), y = B's
// column strip.
template <int R, bool AColumns>
void tile_plain(const float* a, Eigen::Index lda, const float* b, Eigen::Index ldb, float* c,
                Eigen::Index ldc, Eigen::Index k, Eigen::Index columns, bool accumulate) {
  const __mmask16 low = lane_mask(columns), high = lane_mask(columns - 16);
  tile_sums<R, AColumns>(a, lda, b, ldb, k, low, high, [&](int r, __m512 sum0, __m512 sum1) {
    float* row = c + r * ldc;
    if (accumulate) {
      sum0 = _mm512_add_ps(_mm512_maskz_loadu_ps(low, row), sum0);
      sum1 = _mm512_add_ps(_mm512_maskz_loadu_ps(high, row + 16), sum1);
    }
    _mm512_mask_storeu_ps(row, low, sum0);
    _mm512_mask_storeu_ps(row + 16, high, sum1);
  });
}

// The transposed product C = A B^T, computed as C^T = B A^T: x = B's rows (C's columns n0 ..
// n0 + R), y = a strip of A^T (C's rows m0 .. m0 + 32); the tile is stored transposed.
template <int R>
void tile_transposed(const float* b, Eigen::Index ldb, const float* a_t, Eigen::Index ld_at, float* c,
                     Eigen::Index ldc, Eigen::Index k, Eigen::Index rows, bool accumulate) {
  alignas(64) float sums[kTileRows][kTileColumns];
  tile_sums<R>(b, ldb, a_t, ld_at, k, lane_mask(rows), lane_mask(rows - 16),
               [&](int r, __m512 sum0, __m512 sum1) {
                 _mm512_store_ps(sums[r], sum0);
                 _mm512_store_ps(sums[r] + 16, sum1);
               });
  for (Eigen::Index i = 0; i < rows; ++i) {
    float* out = c + i * ldc;
    for (int r = 0; r < R; ++r) out[r] = accumulate ? out[r] + sums[r][i] : sums[r][i];
  }
}

// out[j * ldo + i] = in[i * ldi + j] for i, j < 16: a 16 x 16 block transposed in registers
// (unpack pairs, then 2 x 2 blocks of pairs, then 128- and 256-bit lanes).
inline void transpose_block(const float* in, Eigen::Index ldi, float* out, Eigen::Index ldo) {
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(in + i * ldi);
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    r[4 * i + 0] = _mm512_shuffle_ps(t[4 * i + 0], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i + 0], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 4; ++j) {
      t[8 * i + j] = _mm512_shuffle_f32x4(r[8 * i + j], r[8 * i + 4 + j], 0x88);
      t[8 * i + 4 + j] = _mm512_shuffle_f32x4(r[8 * i + j], r[8 * i + 4 + j], 0xdd);
    }
  }
  for (int j = 0; j < 8; ++j) {
    r[j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0x88);
    r[8 + j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0xdd);
  }
  for (int i = 0; i < 16; ++i) _mm512_storeu_ps(out + i * ldo, r[i]);
}

// a_t (k, m) = a (m, k)^T: whole 16 x 16 blocks in registers, the edges element by element. (An
// element-wise loop over a's rows, 4 KB apart, thrashes the cache's sets: 4 times slower.)
void transpose(const float* a, Eigen::Index lda, float* a_t, Eigen::Index ld_at, Eigen::Index m,
               Eigen::Index k) {
  const Eigen::Index m16 = m / 16 * 16, k16 = k / 16 * 16;
  for (Eigen::Index i = 0; i < m16; i += 16) {
    for (Eigen::Index p = 0; p < k16; p += 16)
      transpose_block(a + i * lda + p, lda, a_t + p * ld_at + i, ld_at);
  }
  for (Eigen::Index i = 0; i < m; ++i) {
    const Eigen::Index first = i < m16 ? k16 : 0;
    for (Eigen::Index p = first; p < k; ++p) a_t[p * ld_at + i] = a[i * lda + p];
  }
}

// body(std::integral_constant<int, R>) with R = rows, 1 to 8: a tile's row count as a template
// argument, so that its accumulators are registers.
template <typename Body>
void dispatch_rows(Eigen::Index rows, Body&& body) {
  switch (rows) {
    case 8:
      return body(std::integral_constant<int, 8>{});
    case 7:
      return body(std::integral_constant<int, 7>{});
    case 6:
      return body(std::integral_constant<int, 6>{});
    case 5:
      return body(std::integral_constant<int, 5>{});
    case 4:
      return body(std::integral_constant<int, 4>{});
    case 3:
      return body(std::integral_constant<int, 3>{});
    case 2:
      return body(std::integral_constant<int, 2>{});
    case 1:
      return body(std::integral_constant<int, 1>{});
    default:
      throw std::logic_error("dispatch_rows: a tile has 1 to 8 rows");
  }
}

// C (m, n) = 0.
void set_zero(float* c, Eigen::Index ldc, Eigen::Index m, Eigen::Index n) {
  for (Eigen::Index i = 0; i < m; ++i) std::fill_n(c + i * ldc, n, 0.0f);
}

// C (+)= A B^T: A^T (k, m) into this thread's scratch (A is the small operand, token rows; B the
// weights), then row tiles of B outside (each read from memory once) and strips of A^T inside.
// lower_only skips the tiles wholly above C's diagonal (C = A A^T, read from its lower triangle).
void transposed_product(const float* a, Eigen::Index lda, const float* b, Eigen::Index ldb, float* c,
                        Eigen::Index ldc, Eigen::Index m, Eigen::Index n, Eigen::Index k, bool accumulate,
                        bool lower_only) {
  thread_local std::vector<float> a_transposed;
  const Eigen::Index ld_at = (m + 15) / 16 * 16;
  if (a_transposed.size() < static_cast<std::size_t>(k * ld_at)) a_transposed.resize(k * ld_at);
  float* a_t = a_transposed.data();
  transpose(a, lda, a_t, ld_at, m, k);
  for (Eigen::Index n0 = 0; n0 < n; n0 += kTileRows) {
    const Eigen::Index tile_rows = std::min<Eigen::Index>(kTileRows, n - n0);
    for (Eigen::Index m0 = 0; m0 < m; m0 += kTileColumns) {
      const Eigen::Index rows = std::min<Eigen::Index>(kTileColumns, m - m0);
      if (lower_only && m0 + rows <= n0) continue;  // every row i < every column j
      dispatch_rows(tile_rows, [&](auto r) {
        tile_transposed<decltype(r)::value>(b + n0 * ldb, ldb, a_t + m0, ld_at, c + m0 * ldc + n0, ldc, k,
                                            rows, accumulate);
      });
    }
  }
}
}  // namespace

void multiply_f32(const float* a, Eigen::Index lda, const float* b, Eigen::Index ldb, float* c,
                  Eigen::Index ldc, Eigen::Index m, Eigen::Index n, Eigen::Index k, Operands operands,
                  bool accumulate) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {  // an empty sum
    if (!accumulate) set_zero(c, ldc, m, n);
    return;
  }
  if (operands != Operands::a_bt) {
    // Column strips of B outside, row tiles of A (or of A^T, read down A's columns) inside: each
    // strip is read from memory once.
    const bool a_columns = operands == Operands::at_b;
    for (Eigen::Index n0 = 0; n0 < n; n0 += kTileColumns) {
      const Eigen::Index columns = std::min<Eigen::Index>(kTileColumns, n - n0);
      for (Eigen::Index m0 = 0; m0 < m; m0 += kTileRows) {
        const Eigen::Index rows = std::min<Eigen::Index>(kTileRows, m - m0);
        dispatch_rows(rows, [&](auto r) {
          if (a_columns) {
            tile_plain<decltype(r)::value, true>(a + m0, lda, b + n0, ldb, c + m0 * ldc + n0, ldc, k, columns,
                                                 accumulate);
          } else {
            tile_plain<decltype(r)::value, false>(a + m0 * lda, lda, b + n0, ldb, c + m0 * ldc + n0, ldc, k,
                                                  columns, accumulate);
          }
        });
      }
    }
    return;
  }
  transposed_product(a, lda, b, ldb, c, ldc, m, n, k, accumulate, false);
}

void gram_lower_f32(const float* a, Eigen::Index lda, float* c, Eigen::Index ldc, Eigen::Index m,
                    Eigen::Index k) {
  if (m <= 0) return;
  if (k <= 0) {  // an empty sum
    set_zero(c, ldc, m, m);
    return;
  }
  transposed_product(a, lda, a, lda, c, ldc, m, m, k, false, true);
}

namespace {
// C[i0 .. i0 + 16, j0 .. j0 + J) = sum_p a[i0 .., p] a[j0 + b, p]: 16 rows as two vectors of a
// column of A, times J broadcast entries of the same column; rows past m masked off.
template <int J>
void gram_tile_f64(const double* a, Eigen::Index lda, double* c, Eigen::Index ldc, Eigen::Index k,
                   Eigen::Index i0, Eigen::Index j0, __mmask8 low, __mmask8 high) {
  __m512d sum0[J], sum1[J];
  for (int b = 0; b < J; ++b) sum0[b] = sum1[b] = _mm512_setzero_pd();
  for (Eigen::Index p = 0; p < k; ++p) {
    const double* column = a + p * lda;
    const __m512d x0 = _mm512_maskz_loadu_pd(low, column + i0);
    const __m512d x1 = _mm512_maskz_loadu_pd(high, column + i0 + 8);
    for (int b = 0; b < J; ++b) {
      const __m512d s = _mm512_set1_pd(column[j0 + b]);
      sum0[b] = _mm512_fmadd_pd(x0, s, sum0[b]);
      sum1[b] = _mm512_fmadd_pd(x1, s, sum1[b]);
    }
  }
  for (int b = 0; b < J; ++b) {
    _mm512_mask_storeu_pd(c + (j0 + b) * ldc + i0, low, sum0[b]);
    _mm512_mask_storeu_pd(c + (j0 + b) * ldc + i0 + 8, high, sum1[b]);
  }
}
}  // namespace

void gram_lower_f64(const double* a, Eigen::Index lda, double* c, Eigen::Index ldc, Eigen::Index m,
                    Eigen::Index k) {
  if (m <= 0) return;
  for (Eigen::Index j = 0; j < m; ++j) std::fill_n(c + j * ldc, m, 0.0);  // also the sum over no k
  if (k <= 0) return;
  const auto mask = [](Eigen::Index lanes) {
    return lanes >= 8 ? __mmask8(0xFF) : lanes <= 0 ? __mmask8(0) : __mmask8((1u << lanes) - 1u);
  };
  for (Eigen::Index i0 = 0; i0 < m; i0 += 16) {
    const __mmask8 low = mask(m - i0), high = mask(m - i0 - 8);
    for (Eigen::Index j0 = 0; j0 < std::min(i0 + 16, m); j0 += 8) {  // tiles reaching the lower triangle
      dispatch_rows(std::min<Eigen::Index>(8, m - j0), [&](auto columns) {
        gram_tile_f64<decltype(columns)::value>(a, lda, c, ldc, k, i0, j0, low, high);
      });
    }
  }
}
#else
void gram_lower_f64(const double*, Eigen::Index, double*, Eigen::Index, Eigen::Index, Eigen::Index) {
  throw std::logic_error("gram_lower_f64 needs an AVX-512 build");
}

void multiply_f32(const float*, Eigen::Index, const float*, Eigen::Index, float*, Eigen::Index, Eigen::Index,
                  Eigen::Index, Eigen::Index, Operands, bool) {
  throw std::logic_error("multiply_f32 needs an AVX-512 build");
}
void gram_lower_f32(const float*, Eigen::Index, float*, Eigen::Index, Eigen::Index, Eigen::Index) {
  throw std::logic_error("gram_lower_f32 needs an AVX-512 build");
}
#endif

}  // namespace gradflow
