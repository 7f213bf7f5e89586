// FM-index over an integer alphabet: a wavelet matrix over the BWT of the reversed token text.
//
// Layout (all flat arrays owned by Python, possibly memory-mapped, and only read here):
//   T  = 0 s1 0 s2 ... 0 sk        the sequences as dense symbols (>= 1), each preceded by separator 0
//   R  = reverse(T), n symbols      searching R backwards = extending a prefix of T to the right
//   rows = n + 1 suffixes of R (row 0 = the empty suffix), BWT[row] = R[SA[row] - 1] (0 where SA = 0)
//   levels  [L][blocks * 32]        wavelet matrix bits, with levels_idx [L][blocks] rank entries (BitRank)
//   zeros   [L]                     zero bits per level
//   offsets [sigma]                 C[c] minus where symbol c starts in the wavelet matrix's last order
//   marks   [blocks * 32]           rows whose suffix position is a multiple of sample_rate (+ marks_idx)
//   samples [marked rows]           suffix position / sample_rate, in row order
//   seps    [k]                     position in T of each sequence's separator (uint32: T < 2^32 symbols)
// A search state is (sp, ep, m): the row range of the reversed prefix and the prefix length in symbols
// (the leading separator of an anchored prefix counts).

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

namespace py = pybind11;
using u64 = uint64_t;
using u32 = uint32_t;

namespace {

// Bit vectors: plain words plus one 64-bit index entry per 2048-bit block (3% space): the count of ones
// before the block (high 34 bits) and the ones in its first three 512-bit sub-blocks (10 bits each).
// A rank reads the entry and at most 8 words of one sub-block.
constexpr u64 kBlockBits = 2048;
constexpr u64 kBlockWords = kBlockBits / 64;

inline u64 blocks_for(u64 nbits) { return nbits / kBlockBits + 1; }  // +1 so rank(nbits) has a block

struct BitRank {
    const u64* bits = nullptr;
    const u64* idx = nullptr;

    inline u64 rank1(u64 i) const {
        const u64 e = idx[i >> 11];
        u64 r = e >> 30;
        const unsigned sub = (i >> 9) & 3;
        if (sub > 0) r += (e >> 20) & 1023;
        if (sub > 1) r += (e >> 10) & 1023;
        if (sub > 2) r += e & 1023;
        const u64 wi = i >> 6;
        for (u64 w = (i >> 9) << 3; w < wi; ++w) r += __builtin_popcountll(bits[w]);
        const unsigned b = i & 63;
        if (b) r += __builtin_popcountll(bits[wi] << (64 - b));
        return r;
    }
    inline u64 rank0(u64 i) const { return i - rank1(i); }
    inline bool get(u64 i) const { return (bits[i >> 6] >> (i & 63)) & 1; }
};

// Fill the index entries of a bit vector whose words are already set.
void finish_ranks(const u64* bits, u64* idx, u64 nblocks) {
    u64 total = 0;
    for (u64 b = 0; b < nblocks; ++b) {
        u64 c[4] = {0, 0, 0, 0};
        for (unsigned k = 0; k < kBlockWords; ++k) c[k >> 3] += __builtin_popcountll(bits[b * kBlockWords + k]);
        idx[b] = (total << 30) | (c[0] << 20) | (c[1] << 10) | c[2];
        total += c[0] + c[1] + c[2] + c[3];
    }
}

inline void set_bit(u64* d, u64 i) { d[i >> 6] |= (1ULL << (i & 63)); }

template <typename T>
const T* ptr_of(const py::array_t<T, py::array::c_style>& a) {
    return a.data();
}

// ------------------------------------------------------------------------------------------- build

// From the suffix array of the byte-packed reversed text (each symbol = `width` big-endian bytes), keep
// the aligned suffixes, and produce the BWT, the sampled-row marks and the samples in one pass.
template <typename SA>
py::tuple bwt_from_packed_sa(py::array_t<SA, py::array::c_style> sa, int width,
                             py::array_t<u32, py::array::c_style> rev, u64 sample_rate) {
    const u64 n = static_cast<u64>(rev.size());
    if (static_cast<u64>(sa.size()) != n * static_cast<u64>(width))
        throw std::invalid_argument("suffix array length does not match the packed text");
    if (sample_rate == 0) throw std::invalid_argument("sample_rate must be positive");
    const SA* s = sa.data();
    const u32* r = rev.data();
    const u64 rows = n + 1;
    py::array_t<u32> bwt(rows);
    const u64 nblocks = blocks_for(rows);
    py::array_t<u64> marks(nblocks * kBlockWords);
    py::array_t<u64> marks_idx(nblocks);
    u32* b = bwt.mutable_data();
    u64* mk = marks.mutable_data();
    u64* mki = marks_idx.mutable_data();
    std::fill(mk, mk + nblocks * kBlockWords, 0ULL);
    std::vector<u32> samples;
    samples.reserve(n / sample_rate + 2);
    u64 dollar_row = 0;
    {
        py::gil_scoped_release release;
        b[0] = n ? r[n - 1] : 0;  // row 0: the empty suffix, preceded by the last symbol
        u64 row = 1;
        const u64 total = n * static_cast<u64>(width);
        for (u64 i = 0; i < total; ++i) {
            const u64 p = static_cast<u64>(s[i]);
            if (p % width) continue;
            const u64 q = p / width;
            b[row] = q ? r[q - 1] : 0;
            if (q == 0) dollar_row = row;
            if (q % sample_rate == 0) {
                set_bit(mk, row);
                samples.push_back(static_cast<u32>(q / sample_rate));
            }
            ++row;
        }
        if (row != rows) throw std::runtime_error("suffix array does not hold every aligned suffix");
        finish_ranks(mk, mki, nblocks);
    }
    py::array_t<u32> samp(samples.size());
    std::copy(samples.begin(), samples.end(), samp.mutable_data());
    return py::make_tuple(bwt, marks, marks_idx, samp, dollar_row);
}

// Wavelet matrix over `symbols` (consumed: used as the work buffer). Returns (levels[L][words], zeros[L]).
py::tuple build_wavelet_matrix(py::array_t<u32, py::array::c_style> symbols, int L) {
    const u64 n = static_cast<u64>(symbols.size());
    const u64 nblocks = blocks_for(n);
    const u64 words = nblocks * kBlockWords;
    py::array_t<u64> levels({static_cast<py::ssize_t>(std::max(L, 1)), static_cast<py::ssize_t>(words)});
    py::array_t<u64> levels_idx({static_cast<py::ssize_t>(std::max(L, 1)), static_cast<py::ssize_t>(nblocks)});
    py::array_t<u64> zeros(std::max(L, 1));
    u64* lv = levels.mutable_data();
    u64* lvi = levels_idx.mutable_data();
    u64* z = zeros.mutable_data();
    u32* cur = symbols.mutable_data();
    {
        py::gil_scoped_release release;
        std::fill(lv, lv + static_cast<u64>(std::max(L, 1)) * words, 0ULL);
        std::fill(lvi, lvi + static_cast<u64>(std::max(L, 1)) * nblocks, 0ULL);
        std::fill(z, z + std::max(L, 1), 0ULL);
        std::vector<u32> ones;
        ones.reserve(n / 2);
        for (int l = 0; l < L; ++l) {
            const int bit = L - 1 - l;
            u64* d = lv + static_cast<u64>(l) * words;
            ones.clear();
            u64 nz = 0;
            for (u64 i = 0; i < n; ++i) {
                const u32 c = cur[i];
                if ((c >> bit) & 1) {
                    set_bit(d, i);
                    ones.push_back(c);
                } else {
                    cur[nz++] = c;  // stable partition in place: zeros stay in order at the front
                }
            }
            std::copy(ones.begin(), ones.end(), cur + nz);
            z[l] = nz;
            finish_ranks(d, lvi + static_cast<u64>(l) * nblocks, nblocks);
        }
    }
    return py::make_tuple(levels, levels_idx, zeros);
}

// ------------------------------------------------------------------------------------------ query

class FMIndex {
   public:
    FMIndex(py::array_t<u64, py::array::c_style> levels, py::array_t<u64, py::array::c_style> levels_idx,
            py::array_t<u64, py::array::c_style> zeros,
            py::array_t<int64_t, py::array::c_style> offsets, py::array_t<u64, py::array::c_style> marks,
            py::array_t<u64, py::array::c_style> marks_idx, py::array_t<u32, py::array::c_style> samples, py::array_t<u32, py::array::c_style> seps,
            py::array_t<int32_t, py::array::c_style> tok2sym, py::array_t<u32, py::array::c_style> sym2tok,
            u64 n, int L, u64 sample_rate, u64 dollar_row)
        : dollar_row_(dollar_row), levels_(levels), levels_idx_(levels_idx), zeros_(zeros), offsets_(offsets), marks_(marks), marks_idx_(marks_idx), samples_(samples), seps_(seps),
          tok2sym_(tok2sym), sym2tok_(sym2tok), n_(n), L_(L), sample_rate_(sample_rate) {
        if (levels.ndim() != 2 || (L > 0 && levels.shape(0) < L)) throw std::invalid_argument("levels: bad shape");
        const u64 words = static_cast<u64>(levels.shape(1));
        if (words != blocks_for(n + 1) * kBlockWords) throw std::invalid_argument("levels: size does not match n");
        const u64 nblocks = blocks_for(n + 1);
        if (static_cast<u64>(marks.size()) != words) throw std::invalid_argument("marks: size does not match n");
        if (static_cast<u64>(marks_idx.size()) != nblocks) throw std::invalid_argument("marks_idx: size does not match n");
        if (levels_idx.ndim() != 2 || static_cast<u64>(levels_idx.shape(1)) != nblocks || levels_idx.shape(0) != levels.shape(0))
            throw std::invalid_argument("levels_idx: bad shape");
        for (int l = 0; l < L; ++l)
            lv_.push_back(BitRank{levels.data() + static_cast<u64>(l) * words, levels_idx.data() + static_cast<u64>(l) * nblocks});
        mk_ = BitRank{marks.data(), marks_idx.data()};
        z_ = zeros.data();
        off_ = offsets.data();
        sigma_ = static_cast<u64>(offsets.size());
        samp_ = samples.data();
        sep_ = seps.data();
        k_ = static_cast<u64>(seps.size());
        t2s_ = tok2sym.data();
        vocab_ = static_cast<u64>(tok2sym.size());
        s2t_ = sym2tok.data();
    }

    u64 size() const { return n_; }
    u64 sequences() const { return k_; }
    u64 sigma() const { return sigma_; }
    int levels() const { return L_; }

    // The prefix anchored at a sequence start (the separator range), or any position.
    std::tuple<u64, u64, u64> start(bool anchored) const {
        if (!anchored) return {0, n_ + 1, 0};  // every row: the next symbol is any token
        return {1, 1 + k_, 1};
    }

    inline int sym_of(int64_t token) const {
        if (token < 0 || static_cast<u64>(token) >= vocab_) return -1;
        return t2s_[token];
    }

    std::tuple<u64, u64, u64> extend(const std::tuple<u64, u64, u64>& st, int64_t token) const {
        const auto [sp, ep, m] = st;
        const int c = sym_of(token);
        if (c <= 0 || sp >= ep) return {0, 0, m + 1};
        u64 a = sp, b = ep;
        for (int l = 0; l < L_; ++l) {
            const BitRank& bv = lv_[l];
            if ((static_cast<u32>(c) >> (L_ - 1 - l)) & 1) {
                a = z_[l] + bv.rank1(a);
                b = z_[l] + bv.rank1(b);
            } else {
                a = bv.rank0(a);
                b = bv.rank0(b);
            }
        }
        const int64_t o = off_[c];
        return {static_cast<u64>(o + static_cast<int64_t>(a)), static_cast<u64>(o + static_cast<int64_t>(b)), m + 1};
    }

    // Distinct symbols of BWT[sp, ep) with their counts, ascending (separator excluded).
    void distinct(u64 sp, u64 ep, std::vector<u32>& ids, std::vector<u64>& counts) const {
        if (sp >= ep) return;
        if (L_ == 0) return;  // only the separator exists
        struct Frame {
            u64 a, b;
            u32 value;
            int level;
        };
        Frame stack[64 * 2 + 2];
        int top = 0;
        stack[top++] = {sp, ep, 0, 0};
        while (top) {
            const Frame f = stack[--top];
            if (f.level == L_) {
                if (f.value) {
                    ids.push_back(s2t_[f.value]);
                    counts.push_back(f.b - f.a);
                }
                continue;
            }
            const BitRank& bv = lv_[f.level];
            const u64 r1a = bv.rank1(f.a), r1b = bv.rank1(f.b);
            const u64 oa = r1b - r1a;              // ones in range
            const u64 za = (f.b - f.a) - oa;       // zeros in range
            // push ones first so zeros (smaller values) pop first: ascending output
            if (oa) stack[top++] = {z_[f.level] + r1a, z_[f.level] + r1b, f.value | (1u << (L_ - 1 - f.level)), f.level + 1};
            if (za) stack[top++] = {f.a - r1a, f.b - r1b, f.value, f.level + 1};
        }
    }

    py::tuple next_tokens(const std::tuple<u64, u64, u64>& st) const {
        const u64 sp = std::get<0>(st), ep = std::get<1>(st);
        // Wide ranges (the first tokens after <docid_start>) list thousands of tokens and recur at every
        // docid a decoder starts: keep their answers (read-only arrays), bounded.
        const bool wide = ep > sp && ep - sp >= kCacheMinRows;
        const u64 key = sp * 0x9E3779B97F4A7C15ULL ^ ep;
        if (wide) {
            auto hit = cache_.find(key);
            if (hit != cache_.end() && hit->second.sp == sp && hit->second.ep == ep) return hit->second.answer;
        }
        std::vector<u32> ids;
        std::vector<u64> counts;
        distinct(sp, ep, ids, counts);
        py::array_t<u32> a(ids.size());
        py::array_t<u64> c(counts.size());
        std::copy(ids.begin(), ids.end(), a.mutable_data());
        std::copy(counts.begin(), counts.end(), c.mutable_data());
        py::tuple answer = py::make_tuple(a, c);
        if (wide) {
            a.attr("flags").attr("writeable") = false;
            c.attr("flags").attr("writeable") = false;
            if (cache_.size() >= kCacheEntries) cache_.clear();
            cache_[key] = Cached{sp, ep, answer};
        }
        return answer;
    }

    // BWT symbol at a row and the row it maps to (LF), walking the levels once.
    inline std::pair<u32, u64> lf(u64 row) const {
        u32 c = 0;
        u64 i = row;
        for (int l = 0; l < L_; ++l) {
            const BitRank& bv = lv_[l];
            if (bv.get(i)) {
                c |= 1u << (L_ - 1 - l);
                i = z_[l] + bv.rank1(i);
            } else {
                i = bv.rank0(i);
            }
        }
        // The whole-text suffix has no predecessor; its BWT slot holds a stand-in 0 that separator ranks
        // must not count.
        const u64 fix = (c == 0 && row > dollar_row_) ? 1 : 0;
        return {c, static_cast<u64>(off_[c] + static_cast<int64_t>(i)) - fix};
    }

    // Position in R of the suffix at a row.
    u64 suffix_at(u64 row) const {
        u64 steps = 0;
        while (!mk_.get(row)) {
            row = lf(row).second;
            ++steps;
        }
        return static_cast<u64>(samp_[mk_.rank1(row)]) * sample_rate_ + steps;
    }

    // (sequence, offset of the first prefix token in it) for up to `limit` occurrences, sorted.
    u64 count(const std::tuple<u64, u64, u64>& st) const {
        const auto [sp, ep, m] = st;
        if (m == 0) return n_ - k_;  // the empty unanchored prefix occurs before every token
        return ep > sp ? ep - sp : 0;
    }

    py::array_t<int64_t> locate(const std::tuple<u64, u64, u64>& st, u64 limit) const {
        const auto [sp, ep, m] = st;
        if (m == 0) throw std::invalid_argument("locate needs a non-empty prefix");
        const u64 take = sp < ep ? std::min(limit, ep - sp) : 0;
        std::vector<std::pair<int64_t, int64_t>> hits;
        hits.reserve(take);
        for (u64 row = sp; row < sp + take; ++row) {
            const u64 q = suffix_at(row);
            const u64 j = n_ - q - m;  // start of the prefix in T
            const u64 seq = static_cast<u64>(std::upper_bound(sep_, sep_ + k_, static_cast<u32>(j)) - sep_) - 1;
            const int64_t off = static_cast<int64_t>(j) - static_cast<int64_t>(sep_[seq]) - 1;
            hits.emplace_back(static_cast<int64_t>(seq), std::max<int64_t>(off, 0));
        }
        std::sort(hits.begin(), hits.end());
        py::array_t<int64_t> out({static_cast<py::ssize_t>(hits.size()), static_cast<py::ssize_t>(2)});
        int64_t* o = out.mutable_data();
        for (size_t i = 0; i < hits.size(); ++i) {
            o[2 * i] = hits[i].first;
            o[2 * i + 1] = hits[i].second;
        }
        return out;
    }

    // Where each symbol's block starts in the last level's order (for building `offsets`).
    py::array_t<u64> symbol_starts(u64 sigma) const {
        py::array_t<u64> out(sigma);
        u64* o = out.mutable_data();
        for (u64 c = 0; c < sigma; ++c) {
            u64 a = 0;
            for (int l = 0; l < L_; ++l) {
                const BitRank& bv = lv_[l];
                a = ((c >> (L_ - 1 - l)) & 1) ? z_[l] + bv.rank1(a) : bv.rank0(a);
            }
            o[c] = a;
        }
        return out;
    }

   private:
    static constexpr u64 kCacheMinRows = 1024;
    static constexpr size_t kCacheEntries = 4096;
    struct Cached {
        u64 sp, ep;
        py::tuple answer;
    };
    mutable std::unordered_map<u64, Cached> cache_;
    u64 dollar_row_;
    // Keep the Python buffers alive (they may be memory maps).
    py::array_t<u64, py::array::c_style> levels_, levels_idx_, zeros_;
    py::array_t<int64_t, py::array::c_style> offsets_;
    py::array_t<u64, py::array::c_style> marks_, marks_idx_;
    py::array_t<u32, py::array::c_style> samples_;
    py::array_t<u32, py::array::c_style> seps_;
    py::array_t<int32_t, py::array::c_style> tok2sym_;
    py::array_t<u32, py::array::c_style> sym2tok_;
    u64 n_;
    int L_;
    u64 sample_rate_;
    std::vector<BitRank> lv_;
    BitRank mk_;
    const u64* z_ = nullptr;
    const int64_t* off_ = nullptr;
    u64 sigma_ = 0;
    const u32* samp_ = nullptr;
    const u32* sep_ = nullptr;
    u64 k_ = 0;
    const int32_t* t2s_ = nullptr;
    u64 vocab_ = 0;
    const u32* s2t_ = nullptr;
};

}  // namespace

PYBIND11_MODULE(_fm, m) {
    m.doc() = "Native FM-index (wavelet matrix over the BWT of reversed token sequences).";
    m.def("bwt_from_packed_sa", &bwt_from_packed_sa<int32_t>, py::arg("sa"), py::arg("width"), py::arg("rev"),
          py::arg("sample_rate"));
    m.def("bwt_from_packed_sa", &bwt_from_packed_sa<int64_t>, py::arg("sa"), py::arg("width"), py::arg("rev"),
          py::arg("sample_rate"));
    m.def("build_wavelet_matrix", &build_wavelet_matrix, py::arg("symbols"), py::arg("levels"));
    py::class_<FMIndex>(m, "FMIndex")
        .def(py::init<py::array_t<u64, py::array::c_style>, py::array_t<u64, py::array::c_style>,
                      py::array_t<u64, py::array::c_style>, py::array_t<int64_t, py::array::c_style>,
                      py::array_t<u64, py::array::c_style>, py::array_t<u64, py::array::c_style>,
                      py::array_t<u32, py::array::c_style>, py::array_t<u32, py::array::c_style>,
                      py::array_t<int32_t, py::array::c_style>, py::array_t<u32, py::array::c_style>, u64, int, u64, u64>(),
             py::arg("levels"), py::arg("levels_idx"), py::arg("zeros"), py::arg("offsets"), py::arg("marks"),
             py::arg("marks_idx"), py::arg("samples"),
             py::arg("seps"), py::arg("tok2sym"), py::arg("sym2tok"), py::arg("n"), py::arg("L"),
             py::arg("sample_rate"), py::arg("dollar_row"))
        .def_property_readonly("size", &FMIndex::size)
        .def_property_readonly("sequences", &FMIndex::sequences)
        .def_property_readonly("sigma", &FMIndex::sigma)
        .def_property_readonly("levels", &FMIndex::levels)
        .def("start", &FMIndex::start, py::arg("anchored") = true)
        .def("extend", &FMIndex::extend, py::arg("state"), py::arg("token"))
        .def("next_tokens", &FMIndex::next_tokens, py::arg("state"))
        .def("count", &FMIndex::count, py::arg("state"))
        .def("locate", &FMIndex::locate, py::arg("state"), py::arg("limit"))
        .def("symbol_starts", &FMIndex::symbol_starts, py::arg("sigma"));
}
