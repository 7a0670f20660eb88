/* engine.c — the public engine: load a model (or dummy weights), pick a backend, run forward
 * calls and the generation loop (prefill, then one decode step per token, stop rules, timing).
 * The sequence position lives here; backends only see (tokens, n, pos). */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "engine.h"
#include "sampler.h"

void q35_options_init(Q35Options *o) {
    memset(o, 0, sizeof *o);
    o->dummy_seed = 1234;
}

static int pick_backend(const char *name, const Backend **out, Err *err) {
    if (!name || !strcmp(name, "auto")) {
        *out = cuda_available() ? &cuda_backend : &cpu_backend;
        return 0;
    }
    if (!strcmp(name, "cpu")) {
        *out = &cpu_backend;
        return 0;
    }
    if (!strcmp(name, "cuda")) {
        *out = &cuda_backend;
        return 0;
    }
    return err_set(err, Q35_ERR_ARG, "unknown backend '%s' (expected cpu, cuda or auto)", name);
}

int q35_engine_open(Q35Engine **out, const Q35Options *opt, Q35Err *err) {
    *out = NULL;
    Q35Engine *e = calloc(1, sizeof *e);
    if (!e) return err_set(err, Q35_ERR_OOM, "out of memory");
    int rc;
    const ModelProgress pr = {opt->progress, opt->progress_user};
    const int fp8 = opt->weights && strcmp(opt->weights, "fp8") == 0;
    if (opt->weights && !fp8 && strcmp(opt->weights, "auto") != 0) {
        rc = err_set(err, Q35_ERR_ARG, "unknown weight format '%s' (expected auto or fp8)", opt->weights);
        goto fail;
    }
    if (opt->dummy) {
        rc = model_dummy_progress(&e->model, opt->dummy, opt->dummy_seed, &pr, err);
    } else if (opt->model_dir) {
        ModelLoadOptions lo = {opt->keep_f32_params, opt->strict};
        rc = model_load_progress(&e->model, opt->model_dir, &lo, &pr, err);
    } else {
        rc = err_set(err, Q35_ERR_ARG, "no model: give a model directory or a dummy model name");
    }
    if (!rc && fp8) rc = model_quantize_fp8(&e->model, err);
    if (rc) goto fail;
    const Config *c = &e->model.config;
    e->n_valid = c->vocab_size;
    if (opt->model_dir) {
        char path[4096];
        if (path_join(path, sizeof path, opt->model_dir, "tokenizer.json") == 0 && file_exists(path)) {
            if ((rc = q35_tokenizer_load(&e->tok, opt->model_dir, err))) goto fail;
            int n = q35_tokenizer_size(e->tok);
            if (n > 0 && n < e->n_valid) e->n_valid = n;
            GenConfig *g = &e->model.gen;
            if (g->n_eos == 0) { /* no generation_config.json: the tokenizer's stop ids */
                const int *stop;
                int k = q35_tokenizer_stop_ids(e->tok, &stop);
                for (int i = 0; i < k && g->n_eos < (int)(sizeof g->eos_ids / sizeof g->eos_ids[0]); i++)
                    g->eos_ids[g->n_eos++] = stop[i];
            }
        }
    }
    if (opt->max_seq < 0) {
        rc = err_set(err, Q35_ERR_ARG, "context size must be positive (got %d)", opt->max_seq);
        goto fail;
    }
    e->max_seq = opt->max_seq ? opt->max_seq : 4096;
    if (e->max_seq > c->max_position_embeddings && c->max_position_embeddings > 0) {
        if (opt->max_seq) {
            rc = err_set(err, Q35_ERR_ARG, "context %d exceeds max_position_embeddings %d", opt->max_seq,
                         c->max_position_embeddings);
            goto fail;
        }
        e->max_seq = c->max_position_embeddings;
    }
    if ((rc = pick_backend(opt->backend, &e->be, err))) goto fail;
    BackendOptions bo = {0};
    bo.max_seq = e->max_seq;
    long hw = sysconf(_SC_NPROCESSORS_ONLN); /* more threads than cores only add contention */
    bo.threads = hw > 0 && opt->threads > hw ? (int)hw : opt->threads;
    bo.deterministic = opt->deterministic;
    bo.no_graph = opt->no_graph;
    bo.device = opt->device;
    bo.probe.dir = opt->probe_dir;
    bo.n_valid = e->n_valid;
    rc = e->be->open(&e->bctx, &e->model, &bo, err);
    if (rc && e->be == &cuda_backend && (!opt->backend || !strcmp(opt->backend, "auto")) &&
        (rc == Q35_ERR_CONFIG || rc == Q35_ERR_UNSUPPORTED)) {
        /* auto: a GPU is there but cannot run this model's shapes -> the CPU, with a note */
        snprintf(e->note, sizeof e->note, "CUDA backend unavailable for this model (%s); using the CPU",
                 err ? err->msg : "");
        e->bctx = NULL;
        e->be = &cpu_backend;
        err_clear(err);
        rc = e->be->open(&e->bctx, &e->model, &bo, err);
    }
    if (rc) goto fail;
    e->logits = malloc(sizeof(float) * (size_t)c->vocab_size);
    if (!e->logits) {
        rc = err_set(err, Q35_ERR_OOM, "out of memory");
        goto fail;
    }
    *out = e;
    return 0;
fail:
    q35_engine_close(e);
    return rc;
}

void q35_engine_close(Q35Engine *e) {
    if (!e) return;
    q35_serve_close(e);
    if (e->bctx) e->be->close(e->bctx);
    if (e->tok) q35_tokenizer_free(e->tok);
    model_free(&e->model);
    free(e->logits);
    free(e);
}

static const char *family_name(int f) { return f == FAMILY_QWEN35 ? "qwen3.5 (hybrid)" : "qwen3 (dense)"; }

int q35_engine_describe(const Q35Engine *e, char *buf, size_t n) {
    const Config *c = &e->model.config;
    const Weights *w = &e->model.w;
    int k = snprintf(buf, n,
                     "model_type: %s\nfamily: %s\nbackend: %s\nhidden_size: %d\nlayers: %d (%d linear_attention, %d "
                     "full_attention)\nlayer_kinds: ",
                     c->model_type, family_name(c->family), e->be->name, c->hidden_size, c->num_hidden_layers,
                     c->n_linear_layers, c->n_full_layers);
    for (int l = 0; l < c->num_hidden_layers && k > 0 && (size_t)k < n; l++)
        k += snprintf(buf + k, n - (size_t)k, "%c", c->layer_types[l] == LAYER_FULL_ATTN ? 'A' : 'D');
    if (k < 0 || (size_t)k >= n) return 0;
    k += snprintf(buf + k, n - (size_t)k,
                  "  (D = Gated DeltaNet, A = full attention)\nattention: %d q heads, %d kv heads, head_dim %d, "
                  "rotary_dim %d, rope_theta %g, output_gate %d\n",
                  c->num_attention_heads, c->num_key_value_heads, c->head_dim, c->rotary_dim, c->rope_theta,
                  c->attn_output_gate);
    if (c->family == FAMILY_QWEN35 && k > 0 && (size_t)k < n)
        k += snprintf(buf + k, n - (size_t)k, "deltanet: %d k heads, %d v heads, dk %d, dv %d, conv kernel %d\n",
                      c->linear_num_key_heads, c->linear_num_value_heads, c->linear_key_head_dim,
                      c->linear_value_head_dim, c->linear_conv_kernel_dim);
    if (k > 0 && (size_t)k < n)
        k += snprintf(buf + k, n - (size_t)k,
                      "mlp: intermediate_size %d\nvocab_size: %d (valid ids %d)\ntied_lm_head: %d\nparameters: "
                      "%lld\nbytes: %lld (%.1f MB)\ndtypes: embed %s, lm_head %s, final norm %s\n"
                      "max_position_embeddings: %d (the model's own maximum context)\ncontext: %d (chosen: --ctx, "
                      "default min(4096, max_position_embeddings))\n",
                      c->intermediate_size, c->vocab_size, e->n_valid, c->tie_word_embeddings,
                      (long long)e->model.n_params, (long long)e->model.n_bytes, e->model.n_bytes / 1e6,
                      dtype_name(w->embed_tokens.dtype), dtype_name(w->lm_head.dtype), dtype_name(w->norm.dtype),
                      c->max_position_embeddings, e->max_seq);
    int64_t fp8_bytes = 0;
    const int n_fp8 = model_fp8_count(&e->model, &fp8_bytes);
    if (k > 0 && (size_t)k < n && n_fp8)
        k += snprintf(buf + k, n - (size_t)k,
                      "weights: fp8 e4m3, 128 x 128 block scales: %d matrices, %lld bytes (%.1f MB) with scales; "
                      "the rest %lld bytes as stored%s\n",
                      n_fp8, (long long)fp8_bytes, fp8_bytes / 1e6, (long long)(e->model.n_bytes - fp8_bytes),
                      e->be == &cpu_backend ? " (cpu backend: dequantized to fp32 at load)" : "");
    else if (k > 0 && (size_t)k < n)
        k += snprintf(buf + k, n - (size_t)k, "weights: as stored (%s matrices)\n",
                      dtype_name(w->layers[0].gate_proj.dtype));
    if (e->be == &cuda_backend && k > 0 && (size_t)k < n) cuda_describe(e->bctx, buf + k, n - (size_t)k);
    return 0;
}

const char *q35_backend_name(const Q35Engine *e) { return e->be->name; }
const char *q35_engine_note(const Q35Engine *e) { return e->note[0] ? e->note : NULL; }
int q35_vocab_size(const Q35Engine *e) { return e->model.config.vocab_size; }
int q35_context_size(const Q35Engine *e) { return e->max_seq; }
int q35_position(const Q35Engine *e) { return e->pos; }
Q35Tokenizer *q35_engine_tokenizer(Q35Engine *e) { return e->tok; }

/* The single-sequence calls share the backend's sequence with serve's fallback: refused while serving. */
static int check_not_serving(const Q35Engine *e, Err *err) {
    if (e->serve)
        return err_set(err, Q35_ERR_ARG, "the engine is serving many sequences: use q35_step (or q35_serve_close)");
    return 0;
}

int q35_reset(Q35Engine *e, Q35Err *err) {
    if (check_not_serving(e, err)) return Q35_ERR_ARG;
    int rc = e->be->reset(e->bctx, err);
    if (rc == 0) e->pos = 0;
    return rc;
}

static int check_ids(const Q35Engine *e, const int *ids, int n, Err *err) {
    int V = e->model.config.vocab_size;
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= V)
            return err_set(err, Q35_ERR_ARG, "token id %d at index %d is out of range [0, %d)", ids[i], i, V);
    return 0;
}

int q35_forward(Q35Engine *e, const int *ids, int n, int all_logits, float *logits, Q35Err *err) {
    if (check_not_serving(e, err)) return Q35_ERR_ARG;
    if (n <= 0) return err_set(err, Q35_ERR_ARG, "forward needs at least one token");
    int rc = check_ids(e, ids, n, err);
    if (rc) return rc;
    if (n > e->max_seq - e->pos)
        return err_set(err, Q35_ERR_CONTEXT, "%d tokens do not fit in the context: %d of %d positions are used", n,
                       e->pos, e->max_seq);
    rc = e->be->forward(e->bctx, ids, n, e->pos, all_logits, logits, err);
    if (rc == 0) e->pos += n;
    return rc;
}

int q35_bench_decode(Q35Engine *e, const Q35BenchRequest *rq, Q35BenchResult *res, Q35Err *err) {
    if (check_not_serving(e, err)) return Q35_ERR_ARG;
    if (!e->be->bench) return err_set(err, Q35_ERR_UNSUPPORTED, "the %s backend has no decode benchmark", e->be->name);
    if (rq->ctx_len < 0 || rq->ctx_len >= e->max_seq)
        return err_set(err, Q35_ERR_CONTEXT, "bench context %d does not fit the context size %d (use --ctx)",
                       rq->ctx_len, e->max_seq);
    e->pos = 0;
    return e->be->bench(e->bctx, rq, res, err);
}

void q35_sampling_defaults(const Q35Engine *e, Q35Sampling *s) {
    const GenConfig *g = &e->model.gen;
    memset(s, 0, sizeof *s);
    s->top_p = 1.0f;
    s->repetition_penalty = 1.0f;
    s->seed = 0;
    if (g->do_sample) {
        s->temperature = g->temperature > 0 ? g->temperature : 1.0f;
        s->top_k = g->top_k;
        s->top_p = g->top_p > 0 && g->top_p <= 1 ? g->top_p : 1.0f;
        s->min_p = g->min_p;
        s->presence_penalty = g->presence_penalty;
        s->repetition_penalty = g->repetition_penalty > 0 ? g->repetition_penalty : 1.0f;
    }
}

static int is_stop(const Q35Engine *e, int id) {
    for (int i = 0; i < e->model.gen.n_eos; i++)
        if (e->model.gen.eos_ids[i] == id) return 1;
    return 0;
}

int q35_generate(Q35Engine *e, const int *prompt, int n_prompt, int max_new, const Q35Sampling *s, Q35TokenFn fn,
                 void *user, Q35GenStats *stats, Q35Err *err) {
    Q35GenStats st = {0};
    st.n_prompt = n_prompt;
    if (check_not_serving(e, err)) return Q35_ERR_ARG;
    if (n_prompt <= 0) return err_set(err, Q35_ERR_ARG, "empty prompt");
    int rc = check_ids(e, prompt, n_prompt, err);
    if (rc) return rc;
    if (n_prompt > e->max_seq - e->pos)
        return err_set(err, Q35_ERR_CONTEXT, "prompt of %d tokens exceeds the context: %d of %d positions are used",
                       n_prompt, e->pos, e->max_seq);
    Sampler sm;
    if ((rc = sampler_init(&sm, s, e->model.config.vocab_size, e->n_valid, err))) return rc;
    for (int i = 0; i < n_prompt; i++) sampler_observe(&sm, prompt[i], 0);

    double t0 = now_s();
    rc = q35_forward(e, prompt, n_prompt, 0, e->logits, err);
    st.prefill_s = now_s() - t0;
    /* with the device's sampler, every draw's u is counter_uniform(seed, index of the id), the first one's too */
    int use_device = e->be->decode_sample != NULL;
    int id = rc ? -1 : use_device ? sampler_sample_at(&sm, e->logits, 0) : sampler_sample(&sm, e->logits);
    if (!rc && id < 0) rc = err_set(err, Q35_ERR_OOM, "out of memory for the sampler");
    t0 = now_s();
    while (rc == 0 && st.n_generated < max_new) {
        st.n_generated++;
        sampler_observe(&sm, id, 1);
        if (fn && fn(user, id)) {
            st.stop_reason = 2;
            break;
        }
        if (is_stop(e, id)) {
            st.stop_reason = 1;
            break;
        }
        if (st.n_generated >= max_new) break;
        if (e->pos >= e->max_seq) {
            st.stop_reason = 3;
            break;
        }
        if (use_device) { /* the penalties' list (sampler_penalties) goes with the step */
            const SamplePenalty *pe = NULL;
            const int np = sampler_penalties(&sm, &pe);
            if (np < 0) {
                rc = err_set(err, Q35_ERR_OOM, "out of memory for the sampler");
                break;
            }
            const DeviceSampling ds = {.temperature = s->temperature,
                                       .top_p = s->top_p,
                                       .min_p = s->min_p,
                                       .top_k = s->top_k,
                                       .seed = s->seed,
                                       .step = (uint64_t)st.n_generated,
                                       .repetition = s->repetition_penalty,
                                       .presence = s->presence_penalty,
                                       .frequency = s->frequency_penalty,
                                       .n_pen = np,
                                       .pen = pe};
            rc = e->be->decode_sample(e->bctx, id, e->pos, &ds, &id, err);
            if (rc == 0) e->pos++;
        } else {
            rc = q35_forward(e, &id, 1, 0, e->logits, err);
            if (rc == 0 && (id = sampler_sample(&sm, e->logits)) < 0)
                rc = err_set(err, Q35_ERR_OOM, "out of memory for the sampler");
        }
    }
    st.decode_s = now_s() - t0;
    sampler_free(&sm);
    if (stats) *stats = st;
    return rc;
}

const char *q35_strerror(int code) {
    switch (code) {
    case Q35_OK: return "ok";
    case Q35_ERR_IO: return "I/O error";
    case Q35_ERR_FORMAT: return "malformed file";
    case Q35_ERR_CONFIG: return "unsupported configuration";
    case Q35_ERR_ARG: return "bad argument";
    case Q35_ERR_OOM: return "out of memory";
    case Q35_ERR_CUDA: return "CUDA error";
    case Q35_ERR_UNSUPPORTED: return "unsupported";
    case Q35_ERR_CONTEXT: return "context full";
    case Q35_ERR_UTF8: return "invalid UTF-8";
    case Q35_ERR_NET: return "network error";
    default: return "unknown error";
    }
}
