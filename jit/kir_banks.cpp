#include "jit/kir_banks.hpp"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>

namespace rag::jit {
namespace {

using kir::Expr;
using kir::Node;
using kir::Op;
using kir::Stmt;
using Value = std::optional<std::int64_t>;

constexpr int kWarp = 32, kBanks = 32;

class Analysis {
  public:
    Analysis(const kir::Kernel& k, std::span<const std::int64_t> params, const GlobalValue& global)
        : k_(k), params_(params), global_(global) {}

    std::vector<BankAccess> run() {
        walk(k_.body, false);
        return out_;
    }

  private:
    // The value of e for lane_ (nullopt: depends on something not derived).
    Value eval(const Expr& e) {
        const Node& n = e.node();
        if (auto it = memo_.find(&n); it != memo_.end()) return it->second;
        const Value v = compute(n);
        memo_[&n] = v;
        return v;
    }
    Value compute(const Node& n) {
        auto arg = [&](std::size_t k) { return eval(n.args[k]); };
        switch (n.op) {
        case Op::const_int:
            return n.i;
        case Op::param:
            return params_[std::size_t(n.i)];
        case Op::program_id:
            return 0;
        case Op::let:
            if (n.i == spread_) {
                const Value lo = eval(spread_lo_);
                return lo ? Value(*lo + lane_) : std::nullopt;
            }
            // Inside an each: warp 0's first element slot, lane 4g + t at row g, column 2t
            // (the mma accumulator's layout, jit/kir_nvptx.cpp).
            if (n.i == each_row_) return lane_ / 4;
            if (n.i == each_col_) return each_cols_ == 1 ? 0 : lane_ % 4 * 2;
            if (auto it = defs_.find(n.i); it != defs_.end()) return eval(it->second);
            return std::nullopt;
        case Op::var:
            if (auto it = vars_.find(n.i); it != vars_.end()) return eval(it->second);
            return std::nullopt;
        case Op::load: {
            if (k_.buffers[std::size_t(n.i)].space != kir::Space::global ||
                n.type != kir::Type::i64)
                return std::nullopt;
            const Value at = arg(0);
            return at ? Value(global_(int(n.i), *at)) : std::nullopt;
        }
        case Op::select: {
            const Value c = arg(0);
            return c ? (*c ? arg(1) : arg(2)) : std::nullopt;
        }
        case Op::neg: {
            const Value x = arg(0);
            return x && n.type == kir::Type::i64 ? Value(-*x) : std::nullopt;
        }
        default:
            break;
        }
        if (n.args.size() != 2 || n.args[0].type() == kir::Type::f32) return std::nullopt;
        const Value a = arg(0), b = arg(1);
        return a && b ? kir::integer_op(n.op, *a, *b) : std::nullopt;
    }

    bool shared(int buf) const { return k_.buffers[std::size_t(buf)].space == kir::Space::shared; }

    // One warp-wide access: word(lane) for lanes 0..31.
    void record(int buf, const char* kind, const std::function<Value()>& word) {
        std::vector<std::int64_t> words;
        for (lane_ = 0; lane_ < kWarp; ++lane_) {
            memo_.clear();
            const Value w = word();
            if (!w) break;
            words.push_back(*w);
        }
        lane_ = 0;
        memo_.clear();
        const int degree = words.size() == kWarp ? bank_degree(words) : 0;
        out_.push_back({k_.buffers[std::size_t(buf)].name, kind, degree});
    }

    // The shared loads in e (each distinct load once), when spread over the warp's lanes.
    void scan(const Expr& e, bool spread, std::set<const Node*>& seen) {
        if (!e.defined() || !seen.insert(&e.node()).second) return;
        const Node& n = e.node();
        for (const Expr& a : n.args) scan(a, spread, seen);
        if (spread && n.op == Op::load && shared(int(n.i)))
            record(int(n.i), "load", [&] { return word(int(n.i), eval(n.args[0])); });
    }

    // The 4-byte word holding element `index` of buffer buf (half arrays pack two a word).
    Value word(int buf, Value index) const {
        const kir::BufferDecl& b = k_.buffers[std::size_t(buf)];
        return index ? Value(b.physical(*index) * kir::elem_bytes(b.elem) / 4) : std::nullopt;
    }
    // Element (r, c) of a matrix view as an element index, for this lane's (r, c).
    Value index(const kir::Matrix& m, std::int64_t r, std::int64_t c) {
        const Value o = eval(m.offset), rs = eval(m.row), cs = eval(m.col);
        return o && rs && cs ? Value(*o + r * *rs + c * *cs) : std::nullopt;
    }
    Value element(const kir::Matrix& m, std::int64_t r, std::int64_t c) {
        return word(m.buf, index(m, r, c));
    }

    // One warp-wide access of 16 bytes per lane (an ldmatrix of `count` 8 x 8 matrices, or
    // a 16-byte copy: count 4): lanes 8m .. 8m + 7 are served in their own pass, 4 words each,
    // at row(lane) (an element index); the degree listed is the worst pass's.
    void record_vector(int buf, const char* kind, int count, const std::function<Value()>& row) {
        int degree = 0;
        for (int m = 0; m < count && degree >= 0; ++m) {
            std::vector<std::int64_t> words;
            for (int i = 0; i < 8; ++i) {
                lane_ = 8 * m + i;
                memo_.clear();
                const Value w = word(buf, row());
                if (!w) {
                    degree = -1;
                    break;
                }
                for (int x = 0; x < 4; ++x) words.push_back(*w + x);
            }
            if (degree >= 0) degree = std::max(degree, bank_degree(words));
        }
        lane_ = 0;
        memo_.clear();
        out_.push_back({k_.buffers[std::size_t(buf)].name, kind, std::max(degree, 0)});
    }

    // The lowering's fragment gathering (jit/kir_nvptx.cpp), first 16 x 8 tile and k step.
    void mma(const kir::Mma& x) {
        auto g = [&] { return std::int64_t(lane_ / 4); };
        auto t2 = [&] { return std::int64_t(lane_ % 4 * 2); };
        if (!kir::on_tensor_cores(x)) { // thread e computes C's element e (row-major)
            auto i = [&] { return std::int64_t(lane_) / x.n; };
            auto j = [&] { return std::int64_t(lane_) % x.n; };
            if (shared(x.a.buf)) record(x.a.buf, "mma A", [&] { return element(x.a, i(), 0); });
            if (shared(x.b.buf)) record(x.b.buf, "mma B", [&] { return element(x.b, 0, j()); });
            if (shared(x.c.buf)) record(x.c.buf, "mma C", [&] { return element(x.c, i(), j()); });
            return;
        }
        // ldmatrix (kir::fragment_load): lane 8m + i addresses row i of matrix m, as in
        // kir_nvptx.cpp's fragment(): A(dx + i, dy) or A(dx, dy + i) with .trans, dx = 8 (m & 1),
        // dy = 8 (m >> 1); B(dy, i) or B(dy + i, 0) with .trans, dy = 8m.
        auto m = [&] { return std::int64_t(lane_ / 8); };
        auto i = [&] { return std::int64_t(lane_ % 8); };
        const kir::FragmentLoad fa = kir::fragment_load(k_, x, false);
        const kir::FragmentLoad fb = kir::fragment_load(k_, x, true);
        if (fa != kir::FragmentLoad::elements) {
            const bool trans = fa == kir::FragmentLoad::ldmatrix_trans;
            record_vector(x.a.buf, "ldmatrix A", 4, [&] {
                const std::int64_t dx = (m() & 1) * 8, dy = (m() >> 1) * 8;
                return trans ? index(x.a, dx, dy + i()) : index(x.a, dx + i(), dy);
            });
        } else if (shared(x.a.buf)) {
            for (int r = 0; r < 4; ++r)
                for (int e = 0; e < 2; ++e)
                    record(x.a.buf, "mma A", [&] {
                        return element(x.a, g() + (r & 1) * 8, t2() + (r >> 1) * 8 + e);
                    });
        }
        if (fb != kir::FragmentLoad::elements) {
            const bool trans = fb == kir::FragmentLoad::ldmatrix_trans;
            record_vector(x.b.buf, "ldmatrix B", 2, [&] {
                return trans ? index(x.b, 8 * m() + i(), 0) : index(x.b, 8 * m(), i());
            });
        } else if (shared(x.b.buf)) {
            for (int r = 0; r < 2; ++r)
                for (int e = 0; e < 2; ++e)
                    record(x.b.buf, "mma B", [&] { return element(x.b, t2() + 8 * r + e, g()); });
        }
        if (shared(x.c.buf))
            for (int q = 0; q < 4; ++q)
                record(x.c.buf, "mma C",
                       [&] { return element(x.c, g() + (q >> 1) * 8, t2() + (q & 1)); });
    }

    void walk(const std::vector<Stmt>& body, bool spread) {
        for (const Stmt& s : body) {
            std::set<const Node*> seen;
            switch (s.kind) {
            case Stmt::Kind::let:
                defs_[s.id] = s.a;
                scan(s.a, spread, seen);
                break;
            case Stmt::Kind::assign:
                vars_[s.id] = s.a;
                scan(s.a, spread, seen);
                break;
            case Stmt::Kind::store:
                scan(s.a, spread, seen);
                scan(s.b, spread, seen);
                if (spread && shared(int(s.id)))
                    record(int(s.id), "store", [&] { return word(int(s.id), eval(s.a)); });
                break;
            case Stmt::Kind::loop:
                scan(s.a, spread, seen);
                scan(s.b, spread, seen);
                if (s.loop == kir::Loop::threads && !spread) { // spread over the block
                    spread_ = s.id;
                    spread_lo_ = s.a;
                    walk(s.body, true);
                    spread_ = -1;
                } else {
                    defs_[s.id] = s.a; // the first iteration
                    walk(s.body, spread);
                }
                break;
            case Stmt::Kind::branch:
                scan(s.a, spread, seen);
                walk(s.body, spread);
                walk(s.orelse, spread);
                break;
            case Stmt::Kind::mma:
                mma(*s.mma);
                break;
            case Stmt::Kind::each: // the shared loads of each element, lanes as the fragment's
                each_row_ = s.a.node().i;
                each_col_ = s.b.node().i;
                each_cols_ = kir::fragment_cols(k_.buffers[std::size_t(s.id)]);
                walk(s.body, true);
                each_row_ = each_col_ = -1;
                break;
            case Stmt::Kind::put:
                scan(s.a, spread, seen);
                break;
            case Stmt::Kind::reduce:
            case Stmt::Kind::await_copies:
                break;
            case Stmt::Kind::copy: // 16 bytes per lane, as the lowering vectorises it
                scan(s.a, spread, seen);
                scan(s.b, spread, seen);
                if (s.bytes == 4) { // one word, from global memory
                    if (spread && shared(int(s.id)))
                        record(int(s.id), "store", [&] { return word(int(s.id), eval(s.a)); });
                    break;
                }
                if (spread && shared(int(s.id)))
                    record_vector(int(s.id), "store", 4, [&] { return eval(s.a); });
                if (spread && shared(int(s.c.node().i)))
                    record_vector(int(s.c.node().i), "load", 4, [&] { return eval(s.b); });
                break;
            }
        }
    }

    const kir::Kernel& k_;
    std::span<const std::int64_t> params_;
    const GlobalValue& global_;
    std::map<std::int64_t, Expr> defs_, vars_; // let (and serial loop index) and var values
    std::int64_t spread_ = -1;                 // the distributed threads loop's index
    std::int64_t each_row_ = -1, each_col_ = -1, each_cols_ = 0; // the open each's lets
    Expr spread_lo_;
    int lane_ = 0;
    std::unordered_map<const Node*, Value> memo_;
    std::vector<BankAccess> out_;
};

} // namespace

int bank_degree(std::span<const std::int64_t> words) {
    std::map<std::int64_t, std::set<std::int64_t>> by_bank;
    for (std::int64_t w : words) by_bank[((w % kBanks) + kBanks) % kBanks].insert(w);
    std::size_t most = 0;
    for (const auto& [bank, distinct] : by_bank) most = std::max(most, distinct.size());
    return int(most);
}

std::vector<BankAccess> kir_bank_conflicts(const kir::Kernel& k,
                                           std::span<const std::int64_t> params,
                                           const GlobalValue& global) {
    return Analysis(k, params, global).run();
}

} // namespace rag::jit
