// einsum(spec, a, b) of two operands, lowered to ops the table already has (no einsum op): every
// letter names one logical axis; the contraction becomes one matmul between transposes, so its
// gradients are matmul's and transpose's. Two shapes of spec:
//  - b an unbatched matrix (a weight): `bnc,cd->bnd` is x @ W over the packed rows;
//  - both batched, the batch letter first everywhere: the letters shared by a, b and the output
//    lead (they index independent products), a's own output letter and b's form the matrix,
//    and the one shared letter missing from the output is contracted per sample. Triangle
//    multiplication outgoing `bikc,bjkc->bijc` is the per-(sample, channel) product
//    [C, ~N_i, ~N_k] @ [C, ~N_k, ~N_j]; incoming `bkic,bkjc->bijc` the same with a, b transposed.
//    With nothing contracted it is a broadcasting product (`bic,bjc->bijc`).
// A letter of one operand that the output lacks is summed first.
#include "frontend/einsum.hpp"

#include <algorithm>

namespace rag::frontend {
namespace {

using Letters = std::string;

struct Operand {
    int id;
    Letters letters; // one per logical axis, batch axis included
    bool batched;
};

bool has(const Letters& s, char c) {
    return s.find(c) != Letters::npos;
}

class Einsum {
  public:
    Einsum(Lowerer& L, Span at) : L_(L), at_(at) {}

    [[noreturn]] void error(const std::string& msg) { L_.error(at_, "einsum: " + msg); }

    const Schema& type(int id) { return L_.builder().function().type(id); }

    // Swaps adjacent axes until x's letters are in `want`'s order (the batch axis never moves).
    // Adjacent swaps never reorder two ragged axes that keep their order, and storage keeps
    // ragged axes first, so all but the necessary reorders of ragged axes are views.
    Operand permute(Operand x, const Letters& want) {
        for (std::size_t p = 0; p < want.size(); ++p)
            for (std::size_t q = x.letters.find(want[p], p); q > p; --q) {
                Attrs at;
                at.set("a", std::int64_t(q - 1));
                at.set("b", std::int64_t(q));
                x.id = L_.op(at_, "transpose", {x.id}, at);
                std::swap(x.letters[q - 1], x.letters[q]);
            }
        return x;
    }

    // Sums the axes of x whose letters appear neither in `other` nor in `out`.
    Operand sum_own(Operand x, const Letters& other, const Letters& out) {
        for (std::size_t p = x.letters.size(); p-- > (x.batched ? 1 : 0);) {
            const char c = x.letters[p];
            if (has(other, c) || has(out, c)) continue;
            Attrs at;
            at.set("axis", std::int64_t(p));
            x.id = L_.op(at_, "sum", {x.id}, at);
            x.letters.erase(p, 1);
        }
        return x;
    }

    // x with extent-1 axes inserted so that its letters become `want` (letters x lacks).
    Operand insert_new(Operand x, const Letters& want) {
        std::string spec;
        for (char c : want)
            spec += std::string(spec.empty() ? "" : ", ") + (has(x.letters, c) ? ":" : "new");
        Attrs at;
        at.set("spec", spec);
        x.id = L_.op(at_, "index", {x.id}, at);
        x.letters = want;
        return x;
    }

    // x @ W with W = b an unbatched matrix of letters {k, d}: k is contracted, d is new.
    Operand weight(Operand a, Operand b, const Letters& out) {
        const char k = has(a.letters, b.letters[0]) ? b.letters[0] : b.letters[1];
        const char d = k == b.letters[0] ? b.letters[1] : b.letters[0];
        if (!has(a.letters, k) || has(a.letters, d) || has(out, k) || !has(out, d))
            error("with an unbatched matrix operand, one of its letters must be contracted with "
                  "the other operand and the other must be an output letter");
        Letters want = a.letters;
        want.erase(want.find(k), 1);
        want += k;
        a = permute(a, want);
        b = permute(b, Letters{k, d});
        Operand y{L_.op(at_, "matmul", {a.id, b.id}), want.substr(0, want.size() - 1) + d,
                  a.batched};
        return y;
    }

    // Both batched: leading shared letters, then [fa, k] @ [k, fb].
    Operand batched(Operand a, Operand b, const Letters& out) {
        Letters lead, contracted;
        std::string fa, fb;
        for (char c : a.letters) {
            if (has(b.letters, c) && has(out, c))
                lead += c;
            else if (has(b.letters, c))
                contracted += c;
            else
                fa += c;
        }
        for (char c : b.letters)
            if (!has(a.letters, c)) fb += c;
        if (contracted.size() > 1)
            error("contracts " + std::to_string(contracted.size()) + " axes ('" + contracted +
                  "'); one at most (reshape first)");
        // Shared letters in output order, the batch letter first.
        Letters shared;
        for (char c : out)
            if (has(lead, c)) shared += c;
        if (contracted.empty()) { // a broadcasting product
            Letters wa, wb;
            for (char c : out) {
                if (has(a.letters, c)) wa += c;
                if (has(b.letters, c)) wb += c;
            }
            a = insert_new(permute(a, wa), out);
            b = insert_new(permute(b, wb), out);
            return {L_.op(at_, "mul", {a.id, b.id}), out, true};
        }
        if (fa.size() > 1 || fb.size() > 1)
            error("each operand may keep one axis of its own in a contraction; '" +
                  (fa.size() > 1 ? fa : fb) + "' are more (reshape first)");
        const char k = contracted[0];
        // A missing free axis becomes an extent-1 axis, dropped again after the product.
        const char one_a = 'A', one_b = 'B'; // not letters of the spec (checked: lower case)
        const char ia = fa.empty() ? one_a : fa[0], ib = fb.empty() ? one_b : fb[0];
        if (fa.empty()) a = insert_new(a, a.letters + one_a);
        if (fb.empty()) b = insert_new(b, b.letters + one_b);
        a = permute(a, shared + ia + k);
        b = permute(b, shared + k + ib);
        Operand y{L_.op(at_, "matmul", {a.id, b.id}), shared + ia + ib, true};
        std::string spec;
        bool drop = false;
        for (char c : y.letters) {
            const bool one = c == one_a || c == one_b;
            drop = drop || one;
            spec += std::string(spec.empty() ? "" : ", ") + (one ? "0" : ":");
        }
        if (drop) {
            Attrs at;
            at.set("spec", spec);
            y.id = L_.op(at_, "index", {y.id}, at);
            y.letters.erase(std::remove_if(y.letters.begin(), y.letters.end(),
                                           [&](char c) { return c == one_a || c == one_b; }),
                            y.letters.end());
        }
        return y;
    }

    LV run(const std::string& spec, int ida, int idb) {
        const std::size_t comma = spec.find(','), arrow = spec.find("->");
        if (comma == std::string::npos || arrow == std::string::npos || arrow < comma ||
            spec.find(',', comma + 1) != std::string::npos)
            error("the spec must read \"<a letters>,<b letters>-><output letters>\", e.g. "
                  "\"bikc,bjkc->bijc\"; got \"" +
                  spec + "\"");
        Operand a{ida, spec.substr(0, comma), type(ida).shape.batched};
        Operand b{idb, spec.substr(comma + 1, arrow - comma - 1), type(idb).shape.batched};
        const Letters out = spec.substr(arrow + 2);
        for (const Letters* s : std::initializer_list<const Letters*>{&a.letters, &b.letters, &out})
            for (std::size_t p = 0; p < s->size(); ++p) {
                if ((*s)[p] < 'a' || (*s)[p] > 'z')
                    error("letters must be a-z, got '" + std::string(1, (*s)[p]) + "' in \"" +
                          spec + "\"");
                if (s->find((*s)[p], p + 1) != Letters::npos)
                    error("letter '" + std::string(1, (*s)[p]) + "' repeats in \"" + *s +
                          "\" (diagonals are not supported)");
            }
        for (Operand* x : {&a, &b}) {
            const int rank = type(x->id).shape.logical_rank();
            if (int(x->letters.size()) != rank)
                error("\"" + x->letters + "\" has " + std::to_string(x->letters.size()) +
                      " letters but its operand " + type(x->id).str() + " has " +
                      std::to_string(rank) + " axes");
        }
        for (char c : out)
            if (!has(a.letters, c) && !has(b.letters, c))
                error("output letter '" + std::string(1, c) + "' is in neither operand");
        if (!a.batched && b.batched) std::swap(a, b); // the product commutes
        if (a.batched && b.batched) {
            if (a.letters[0] != b.letters[0] || out.empty() || out[0] != a.letters[0])
                error("the batch axis (each batched operand's first letter) must be the same "
                      "letter in both operands and lead the output; got \"" +
                      spec + "\"");
        } else if (b.letters.size() != 2) {
            error("an unbatched operand must be a matrix (two letters), got \"" + b.letters +
                  "\"; the other operand may be batched");
        }
        a = sum_own(a, b.letters, out);
        b = sum_own(b, a.letters, out);
        Operand y = a.batched && b.batched ? batched(a, b, out) : weight(a, b, out);
        Letters got = y.letters, want = out;
        std::sort(got.begin(), got.end());
        std::sort(want.begin(), want.end());
        if (got != want)
            error("the output \"" + out + "\" must list every letter that is not contracted");
        return LV::tensor(permute(y, out).id);
    }

  private:
    Lowerer& L_;
    Span at_;
};

} // namespace

LV einsum(Lowerer& L, const ast::Expr& call) {
    std::vector<const ast::Expr*> args;
    for (const auto& a : call.args) {
        if (!a.keyword.empty()) L.error(a.span, "einsum takes no keyword arguments");
        args.push_back(a.value.get());
    }
    if (args.size() != 3)
        L.error(call.span, "einsum takes a spec and two operands: einsum(\"bikc,bjkc->bijc\", a, "
                           "b); got " +
                               std::to_string(args.size()) + " arguments");
    if (args[0]->kind != ast::Expr::Kind::string)
        L.error(args[0]->span, "einsum's first argument must be a quoted spec such as "
                               "\"bikc,bjkc->bijc\"");
    const int a = L.tensor(*args[1]), b = L.tensor(*args[2]);
    return Einsum(L, call.span).run(args[0]->name, a, b);
}

} // namespace rag::frontend
