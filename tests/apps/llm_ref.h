/*
 * llm_ref.h - the float64 reference forward pass the weft-llm tests hold
 * the model's logits to (test_llm.c, test_llm_moe.c): written here with
 * plain loops from the architectures' definitions (Llama with Llama 3's
 * RoPE scaling, Mistral's window, Qwen2's biases, Qwen3's per-head norms,
 * FP8 projections with their inputs quantized per token, and the
 * mixture-of-experts MLPs of Mixtral, Qwen2-MoE and Qwen3-MoE),
 * one token at a time. Include after cmocka.h and llm_test.h.
 */
#ifndef LLM_REF_H
#define LLM_REF_H

#include <float.h>

/* The reference keeps every activation in double but rounds it to the
 * model's dtype where weft-llm stores it between ops, so the two differ
 * only by fp32 against double arithmetic inside each op (RoPE excepted:
 * its fp32 rotation is part of its contract, and mirrored). */
typedef struct ref {
    const wl_model *m;
    int pos;
    double *kc, *vc; /* [layer][pos][kv_dim] */
    int alt;         /* a deliberate mistake (check_forward's ALT_*), to show it is seen */
    /* the last token's closest routing: the gap between the last expert a
     * router chose and the best one it did not, in bf16 units of the
     * row's largest |logit|, the least over the layers (INFINITY dense) */
    double route_margin;
} ref;

/* What the logits must differ from, by more than the tolerance, to show
 * that the comparison can tell: nothing; a reference that ignores Llama
 * 3's RoPE scaling, or one whose sliding window is a token shorter or
 * longer (the window's convention, off by one either way); for a mixture
 * of experts, one that renormalises the top k where the model does not or
 * the other way round, one that runs expert e + 1 (mod E) where expert e
 * was chosen (the experts' blocks packed one off), or one that adds the
 * shared expert with_alt by its sigmoid gate. */
enum {
    ALT_NONE,
    ALT_UNSCALED,
    ALT_WINDOW_SHORTER,
    ALT_WINDOW_LONGER,
    ALT_RENORM_FLIPPED,
    ALT_EXPERT_SHIFTED,
    ALT_SHARED_UNGATED
};

static double w(const wl_model *m, const void *p, size_t i)
{
    return wl_load(m->dtype, p, i);
}

static double rnd(const wl_model *m, double v)
{
    return wl_round(m->dtype, v);
}

static void rmsnorm(const wl_model *m, double *out, const double *x, const void *weight, int n)
{
    double ss = 0;
    for (int i = 0; i < n; i++)
        ss += x[i] * x[i];
    double r = 1.0 / sqrt(ss / n + m->cfg.rms_eps);
    for (int i = 0; i < n; i++)
        out[i] = rnd(m, x[i] * r * w(m, weight, (size_t)i));
}

/* out[o] = sum_i x[i] W[o][i] (+ add[o]) */
static void matvec(const wl_model *m, double *out, const double *x, const void *W, int n_out,
                   int n_in, const double *add, int round)
{
    for (int o = 0; o < n_out; o++) {
        double s = add ? add[o] : 0;
        for (int i = 0; i < n_in; i++)
            s += x[i] * w(m, W, (size_t)o * n_in + i);
        out[o] = round ? rnd(m, s) : s;
    }
}

/* FP8 E4M3's value of a byte, and a float rounded to the nearest one (a
 * tie to the even code, saturating at 448), both by this file's own
 * reckoning, for an FP8 model's projections. */
static double e4m3_value(unsigned b)
{
    int e = (int)(b & 0x7f) >> 3, mant = (int)b & 7;
    double v = e ? ldexp(1 + mant / 8.0, e - 7) : ldexp(mant, -9);
    return b & 0x80 ? -v : v;
}

static double e4m3_round(float x)
{
    double a = fabs((double)x), best = 0;
    unsigned code = 0;
    for (unsigned c = 1; c <= 0x7e; c++) {
        double d = fabs(a - e4m3_value(c)), db = fabs(a - best);
        if (d < db || (d == db && (c & 1) == 0 && (code & 1)))
            best = e4m3_value(c), code = c;
    }
    return x < 0 ? -best : best;
}

/* An FP8 model's projection: x quantized as the forward pass does (its
 * largest magnitude over 448, in fp32, a floor of FLT_MIN), each product
 * of the FP8 values in double times both scales, rounded once. */
static void matvec_fp8(const wl_model *m, double *out, const double *x, const void *W,
                       const float *w_scale, int n_out, int n_in, const double *add)
{
    float amax = 0;
    for (int i = 0; i < n_in; i++)
        amax = fmaxf(amax, fabsf((float)x[i]));
    float sx = fmaxf(amax / 448.0f, FLT_MIN);
    double xq[512];
    assert_true(n_in <= 512);
    for (int i = 0; i < n_in; i++)
        xq[i] = e4m3_round((float)x[i] / sx);
    for (int o = 0; o < n_out; o++) {
        double s = 0;
        for (int i = 0; i < n_in; i++)
            s += xq[i] * e4m3_value(((const uint8_t *)W)[(size_t)o * n_in + i]);
        s *= (double)sx * w_scale[o];
        out[o] = rnd(m, (add ? add[o] : 0) + s);
    }
}

/* A layer's projection: matvec, or matvec_fp8 for FP8 weights. */
static void project(const wl_model *m, double *out, const double *x, const void *W,
                    const float *w_scale, int n_out, int n_in, const double *add)
{
    if (w_scale)
        matvec_fp8(m, out, x, W, w_scale, n_out, n_in, add);
    else
        matvec(m, out, x, W, n_out, n_in, add, 1);
}

/* The rotary frequency of pair i; Llama 3's scaling written out as its
 * paper gives it: wavelengths under original / high_freq kept, over
 * original / low_freq divided by factor, a linear blend in 1/wavelength
 * between. */
static double freq(const wl_config *c, int i)
{
    double f = pow(c->rope_theta, -2.0 * i / c->head_dim);
    if (!c->rope_llama3)
        return f;
    double ratio = c->rope_original_max * f / (2 * M_PI); /* original / wavelength */
    if (ratio > c->rope_high_freq)
        return f;
    if (ratio < c->rope_low_freq)
        return f / c->rope_factor;
    double t = (ratio - c->rope_low_freq) / (c->rope_high_freq - c->rope_low_freq);
    return t * f + (1 - t) * f / c->rope_factor;
}

/* As weft_rope documents it: the angle, its sine and cosine in double,
 * rounded to fp32; the rotation in fp32 (so that the reference rounds to
 * bf16 from the same fp32 value and no rotated element rounds the other
 * way). */
static void rope(const wl_model *m, double *v, int heads, int pos)
{
    int hd = m->cfg.head_dim, half = hd / 2;
    for (int h = 0; h < heads; h++)
        for (int i = 0; i < half; i++) {
            double a = pos * freq(&m->cfg, i);
            float cs = (float)cos(a), sn = (float)sin(a);
            float x = (float)v[h * hd + i], y = (float)v[h * hd + i + half];
            float rx = x * cs - y * sn, ry = x * sn + y * cs;
            v[h * hd + i] = rnd(m, rx);
            v[h * hd + i + half] = rnd(m, ry);
        }
}

/* Qwen2's biases: out = x W^T + b, rounded once. */
static void matvec_bias(const wl_model *m, double *out, const double *x, const void *W,
                        const float *w_scale, const void *b, int n_out, int n_in)
{
    double add[256];
    for (int o = 0; b && o < n_out; o++)
        add[o] = w(m, b, (size_t)o);
    project(m, out, x, W, w_scale, n_out, n_in, b ? add : NULL);
}

/* Qwen3's RMSNorm over each head. */
static void head_norm(const wl_model *m, double *v, int heads, const void *weight)
{
    int hd = m->cfg.head_dim;
    for (int h = 0; h < heads; h++) {
        double tmp[256];
        memcpy(tmp, v + h * hd, hd * sizeof *tmp);
        rmsnorm(m, v + h * hd, tmp, weight, hd);
    }
}

static double silu(double v)
{
    return v / (1 + exp(-v));
}

/* SwiGLU's activation of width I on h, into a: SiLU(h Wg^T) * (h Wu^T),
 * each rounded as the ops store it. */
static void swiglu(const wl_model *m, double *a, const double *h, const void *gate, const void *up,
                   const float *gate_scale, const float *up_scale, int I)
{
    int H = m->cfg.hidden;
    double u[512];
    assert_true(I <= 512);
    project(m, a, h, gate, gate_scale, I, H, NULL);
    project(m, u, h, up, up_scale, I, H, NULL);
    for (int i = 0; i < I; i++)
        a[i] = rnd(m, silu(a[i]) * u[i]);
}

/* A mixture-of-experts MLP on the normed row h, added to x: the router's
 * logits (rounded to the dtype, as its matmul stores them), the k largest
 * in order (ties to the lower expert: a strict comparison from expert 0
 * up), their softmax over all E in double, renormalised over the k when
 * the config says; each chosen expert's SwiGLU MLP; x + the weighted sum,
 * rounded once (the combine adds the residual in the same pass). Then
 * Qwen2-MoE's shared expert: x + sigmoid(h . w_sg) * its MLP, rounded. */
static void ref_moe(ref *r, const wl_layer *L, const double *h, double *x)
{
    const wl_model *m = r->m;
    const wl_config *c = &m->cfg;
    int H = c->hidden, E = c->experts, K = c->experts_per_token;
    double logit[256], a[512], y[256], acc[256], mx = -INFINITY, z = 0, p[8], psum = 0;
    int chosen[8], taken[256] = {0};
    assert_true(E <= 256 && K <= 8 && H <= 256);
    matvec(m, logit, h, L->router, E, H, NULL, 1);
    for (int j = 0; j < K; j++) {
        int best = -1;
        for (int e = 0; e < E; e++)
            if (!taken[e] && (best < 0 || logit[e] > logit[best]))
                best = e;
        taken[best] = 1;
        chosen[j] = best;
    }
    double top = 0, next = -INFINITY;
    for (int e = 0; e < E; e++) {
        top = fmax(top, fabs(logit[e]));
        if (!taken[e])
            next = fmax(next, logit[e]);
    }
    if (K < E)
        r->route_margin = fmin(r->route_margin, (logit[chosen[K - 1]] - next) / (top / 128));
    for (int e = 0; e < E; e++)
        mx = fmax(mx, logit[e]);
    for (int e = 0; e < E; e++)
        z += exp(logit[e] - mx);
    for (int j = 0; j < K; j++)
        psum += p[j] = exp(logit[chosen[j]] - mx) / z;
    int renorm = c->norm_topk_prob != (r->alt == ALT_RENORM_FLIPPED);
    memcpy(acc, x, (size_t)H * sizeof *acc);
    for (int j = 0; j < K; j++) {
        int e = r->alt == ALT_EXPERT_SHIFTED ? (chosen[j] + 1) % E : chosen[j];
        const void *const *ex = L->expert + 3 * e;
        swiglu(m, a, h, ex[0], ex[1], NULL, NULL, c->moe_intermediate);
        matvec(m, y, a, ex[2], H, c->moe_intermediate, NULL, 1);
        for (int i = 0; i < H; i++)
            acc[i] += (renorm ? p[j] / psum : p[j]) * y[i];
    }
    for (int i = 0; i < H; i++)
        x[i] = rnd(m, acc[i]);
    if (!c->shared_intermediate)
        return;
    double gl;
    swiglu(m, a, h, L->shared_gate, L->shared_up, NULL, NULL, c->shared_intermediate);
    matvec(m, y, a, L->shared_down, H, c->shared_intermediate, NULL, 1);
    matvec(m, &gl, h, L->shared_router, 1, H, NULL, 1);
    double scale = r->alt == ALT_SHARED_UNGATED ? 1 : 1 / (1 + exp(-gl));
    for (int i = 0; i < H; i++)
        x[i] = rnd(m, x[i] + scale * y[i]);
}

static void ref_token(ref *r, int32_t id, double *logits)
{
    const wl_model *m = r->m;
    const wl_config *c = &m->cfg;
    int H = c->hidden, I = c->intermediate, hd = c->head_dim;
    int qd = c->heads * hd, kvd = c->kv_heads * hd, group = c->heads / c->kv_heads;
    double x[256], h[256], q[256], k[256], v[256], att[256], a[512];
    assert_true(H <= 256 && qd <= 256);
    r->route_margin = INFINITY;
    for (int i = 0; i < H; i++)
        x[i] = w(m, m->embed, (size_t)id * H + i);
    for (int l = 0; l < c->layers; l++) {
        const wl_layer *L = &m->layer[l];
        rmsnorm(m, h, x, L->attn_norm, H);
        matvec_bias(m, q, h, L->q, L->q_scale, L->q_bias, qd, H);
        matvec_bias(m, k, h, L->k, L->k_scale, L->k_bias, kvd, H);
        matvec_bias(m, v, h, L->v, L->v_scale, L->v_bias, kvd, H);
        if (c->qk_norm) {
            head_norm(m, q, c->heads, L->q_norm);
            head_norm(m, k, c->kv_heads, L->k_norm);
        }
        rope(m, q, c->heads, r->pos);
        rope(m, k, c->kv_heads, r->pos);
        double *kc = r->kc + (size_t)l * 64 * kvd, *vc = r->vc + (size_t)l * 64 * kvd;
        memcpy(kc + (size_t)r->pos * kvd, k, kvd * sizeof *k);
        memcpy(vc + (size_t)r->pos * kvd, v, kvd * sizeof *v);
        for (int hh = 0; hh < c->heads; hh++) {
            int ko = (hh / group) * hd;
            double s[64], mx = -INFINITY, sum = 0;
            int lo = c->sliding_window && r->pos >= c->sliding_window
                         ? r->pos - c->sliding_window + 1
                         : 0; /* Mistral: the last sliding_window positions */
            for (int j = 0; j < lo; j++)
                s[j] = 0;
            for (int j = lo; j <= r->pos; j++) {
                s[j] = 0;
                for (int i = 0; i < hd; i++)
                    s[j] += q[hh * hd + i] * kc[(size_t)j * kvd + ko + i];
                s[j] /= sqrt(hd);
                mx = fmax(mx, s[j]);
            }
            for (int j = lo; j <= r->pos; j++)
                sum += s[j] = exp(s[j] - mx);
            for (int i = 0; i < hd; i++) {
                double o = 0;
                for (int j = lo; j <= r->pos; j++)
                    o += s[j] / sum * vc[(size_t)j * kvd + ko + i];
                att[hh * hd + i] = rnd(m, o);
            }
        }
        project(m, x, att, L->o, L->o_scale, H, qd, x);
        rmsnorm(m, h, x, L->mlp_norm, H);
        if (L->moe) {
            ref_moe(r, L, h, x);
            continue;
        }
        swiglu(m, a, h, L->gate, L->up, L->gate_scale, L->up_scale, I);
        project(m, x, a, L->down, L->down_scale, H, I, x); /* the residual is the matmul's C */
    }
    rmsnorm(m, h, x, m->final_norm, H);
    matvec(m, logits, h, m->lm_head, c->vocab, H, NULL, 0);
    r->pos++;
}

/* n token ids from st for comparing m's logits across backends, whose sums
 * are ordered differently: a router whose two logits sit within a bf16
 * unit or two of each other may choose either expert, and the logits then
 * move by tens of units - a tie, not a mistake. So the ids are drawn again
 * (up to 1000 times) while the reference routes any of them within margin
 * units of a tie. Returns how many draws it took (1 for a dense model). */
static inline int ref_draw_ids(const wl_model *m, uint64_t *st, int32_t *ids, int n, double margin)
{
    size_t cache = (size_t)m->cfg.layers * 64 * 128;
    double *logits = malloc((size_t)m->cfg.vocab * sizeof *logits);
    ref r = {m, 0, calloc(cache, sizeof(double)), calloc(cache, sizeof(double)), ALT_NONE, 0};
    assert_true(n <= 64 && logits && r.kc && r.vc);
    int draws = 0, tied = 1;
    while (tied && draws++ < 1000) {
        for (int i = 0; i < n; i++)
            ids[i] = (int32_t)(wl_rand_next(st) % (uint64_t)m->cfg.vocab);
        r.pos = tied = 0;
        for (int i = 0; i < n && !tied && m->cfg.experts; i++) {
            ref_token(&r, ids[i], logits);
            tied = r.route_margin < margin;
        }
    }
    free(logits), free(r.kc), free(r.vc);
    assert_false(tied);
    return draws;
}

/* The model in folder model (prompt of 6 tokens drawn from seed, then 3
 * decode steps) against the reference: every logit within one bf16 unit
 * at the logits' scale (3 for a mixture of experts, below); with alt, the
 * reference with that mistake must be more than 4 units off (for a mixture
 * of experts 1.2 times its tolerance: the mistake must fail the comparison
 * itself, with a fifth to spare; the Qwen2-MoE shared expert's gate, the
 * subtlest of them, moved the logits by only 4.3 units in one seed,
 * 1796561437, and by 10 or more in sixty others). */
static inline void check_forward(const char *model, int alt, uint64_t seed)
{
    int with_alt = alt != ALT_NONE;
    double tol_units = 1, alt_units = 4;
    wl_model m;
    if (wl_model_open(&m, model))
        fail_msg("%s", wl_error());
    printf("  %s\n", model);
    /* An FP8 model: an activation the other side of a bf16 rounding takes
     * the neighbouring E4M3 code, a step of 16 bf16 units (seen once to
     * move a logit by 1.8 units): 3, as a mixture of experts. */
    if (m.cfg.experts || m.cfg.fp8) {
        tol_units = 3;
        alt_units = 1.2 * tol_units;
    }
    int V = m.cfg.vocab, n_prompt = 6, n_total = 9, steps = n_total - n_prompt + 1;
    uint64_t st = seed ^ 0x5eed;
    int32_t ids[9];
    for (int i = 0; i < n_total; i++)
        ids[i] = (int32_t)(wl_rand_next(&st) % (uint64_t)V);
    float *got = malloc((size_t)steps * V * 4);
    char message[512];
    if (run_forward(WEFT_BACKEND_HOST, model, ids, n_prompt, n_total, got, message))
        fail_msg("forward: %s", message);

    size_t cache = (size_t)m.cfg.layers * 64 * 128;
    ref r = {&m, 0, calloc(cache, sizeof(double)), calloc(cache, sizeof(double)), ALT_NONE, 0};
    wl_model m_plain = m;
    if (alt == ALT_UNSCALED)
        m_plain.cfg.rope_llama3 = 0;
    else if (alt == ALT_WINDOW_SHORTER || alt == ALT_WINDOW_LONGER)
        m_plain.cfg.sliding_window += alt == ALT_WINDOW_SHORTER ? -1 : 1;
    ref plain = {&m_plain, 0, calloc(cache, sizeof(double)), calloc(cache, sizeof(double)), alt, 0};
    double worst_plain = 0, max_scale = 0;
    double *want = malloc((size_t)V * sizeof *want);
    for (int i = 0; i < n_total; i++) {
        ref_token(&r, ids[i], want);
        if (i < n_prompt - 1) {
            if (with_alt)
                ref_token(&plain, ids[i], want);
            continue;
        }
        const float *g = got + (size_t)(i - n_prompt + 1) * V;
        double scale = 0, worst = 0;
        int arg_w = 0, arg_g = 0;
        for (int k = 0; k < V; k++) {
            scale = fmax(scale, fabs(want[k]));
            worst = fmax(worst, fabs(g[k] - want[k]));
            if (isnan(g[k]))
                fail_msg("logit %d of token %d was not written", k, i);
            arg_w = want[k] > want[arg_w] ? k : arg_w;
            arg_g = g[k] > g[arg_g] ? k : arg_g;
        }
        max_scale = fmax(max_scale, scale);
        /* bf16 keeps 8 significant bits: one unit in its last place at the
         * logits' scale is scale / 128. The host ops compute as the
         * reference does (fp32, one rounding to bf16), so an activation
         * that rounds the other way is rare (a few runs in ten; seen to move
         * a logit by up to half a unit through sharp attention): one unit
         * is the bound, which the RoPE scaling's effect exceeds many times
         * (the alt check). A mixture of experts amplifies such a flip
         * through its wider expert weights (seen up to 1.4 units in 100
         * seeds of the MoE tests; the mistakes they check move the logits
         * by 10 units or more): there the bound is 3 units. */
        double unit = scale / 128, tol = tol_units * unit;
        printf("  token %d: max |logit| %.4f, max difference %.2e (%.5f of a bf16 unit), "
               "argmax %d / %d\n",
               i, scale, worst, worst / unit, arg_g, arg_w);
        assert_true(worst <= tol);
        assert_true(scale > 0.01); /* not a degenerate model */
        if (with_alt) {
            double off = 0;
            ref_token(&plain, ids[i], want);
            for (int k = 0; k < V; k++)
                off = fmax(off, fabs(g[k] - want[k]));
            static const char *const what[] = {"",
                                               "without the RoPE scaling",
                                               "with a window a token shorter",
                                               "with a window a token longer",
                                               "with the top k's renormalisation flipped",
                                               "running expert e + 1 where e was chosen",
                                               "with the shared expert ungated"};
            printf("    against the reference %s: %.2e\n", what[alt], off);
            worst_plain = fmax(worst_plain, off);
        }
    }
    if (with_alt)
        assert_true(worst_plain > alt_units * max_scale / 128); /* far past the tolerance */
    free(want);
    free(r.kc);
    free(r.vc);
    free(plain.kc);
    free(plain.vc);
    free(got);
    wl_model_close(&m);
}

#endif
