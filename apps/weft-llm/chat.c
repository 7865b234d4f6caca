/*
 * chat.c - a model's chat template: which format it is, and an OpenAI-style
 * list of messages checked and rendered in that format.
 *
 * Hugging Face keeps the template as Jinja source (tokenizer_config.json's
 * chat_template, or a chat_template.jinja beside it). This code does NOT
 * interpret Jinja. It recognises the template's FAMILY from markers in its
 * text, and chat_format.c writes that family's format with its own code:
 *   ChatML   <|im_start|>role\ncontent<|im_end|>\n (Qwen2, Qwen2.5, Qwen3, ...)
 *   Llama 3  <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>
 *   Llama 2  <s>[INST] <<SYS>>\nsystem\n<</SYS>>\n\nuser [/INST] answer </s>
 *   Mistral  <s>[INST] user [/INST] answer</s>, the system prompt folded in
 * Within a family, the details that differ between model versions are read
 * from the template text too, each by a marker named where it is read
 * (Qwen's default system message, Qwen3's thinking blocks, Llama 3.1's
 * dated system header, Mistral's spaces around [INST]). A template edited
 * past what its markers show renders as its family does, not as it says;
 * one that matches no family loads, and rendering it is an error naming
 * the families known. Tool calls and tool definitions are not rendered.
 *
 * A wl_chat is read-only once loaded: render may run on several threads.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>
#include <sys/stat.h>

#include <jansson.h>

#include "chat_impl.h"

static const char *const family_names[] = {NULL, NULL, "ChatML", "Llama 3", "Llama 2", "Mistral"};

#define KNOWN "(known: ChatML, Llama 3, Llama 2, Mistral)"

/* The text that follows marker in t, up to (not including) the first of
 * the stop characters; NULL when marker is absent. */
static char *text_after(const char *t, const char *marker, const char *stops)
{
    const char *p = strstr(t, marker);
    if (!p)
        return NULL;
    p += strlen(marker);
    return strndup(p, strcspn(p, stops));
}

/* ---- loading ------------------------------------------------------------------ */

static void set_problem(wl_chat *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_problem(wl_chat *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    free(c->problem);
    if (vasprintf(&c->problem, fmt, ap) < 0)
        c->problem = NULL;
    va_end(ap);
}

/* A token's text in tokenizer_config.json: a string, an AddedToken object
 * with "content", or null. */
static int token_text(const char *path, json_t *root, const char *key, char **out)
{
    json_t *v = json_object_get(root, key);
    if (!v || json_is_null(v))
        return 0;
    if (json_is_object(v))
        v = json_object_get(v, "content");
    if (!json_is_string(v))
        return wl_fail("%s: %s is not a string or an object with a string \"content\"", path, key);
    if (!(*out = strdup(json_string_value(v))))
        return wl_fail("out of memory");
    return 0;
}

/* chat_template: a string, or a list of {name, template} of which the one
 * named "default" is taken. *tmpl stays NULL when there is none; a list
 * without a default sets c->problem. */
static int config_template(wl_chat *c, const char *path, json_t *root, const char **tmpl)
{
    json_t *v = json_object_get(root, "chat_template");
    if (!v || json_is_null(v))
        return 0;
    if (json_is_string(v)) {
        *tmpl = json_string_value(v);
        return 0;
    }
    if (!json_is_array(v))
        return wl_fail("%s: chat_template is not a string or a list of named templates", path);
    size_t i;
    json_t *e;
    char names[256] = "";
    json_array_foreach(v, i, e)
    {
        const char *name = json_string_value(json_object_get(e, "name"));
        const char *t = json_string_value(json_object_get(e, "template"));
        if (!name || !t)
            return wl_fail("%s: chat_template[%zu] is not an object with string \"name\" and "
                           "\"template\"",
                           path, i);
        if (!strcmp(name, "default")) {
            *tmpl = t;
            return 0;
        }
        size_t at = strlen(names);
        snprintf(names + at, sizeof names - at, "%s\"%s\"", at ? ", " : "", name);
    }
    set_problem(c, "%s: chat_template lists templates (%s) but none named \"default\"", path,
                names);
    return 0;
}

static int read_text(const char *path, char **out)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return wl_fail("%s: %s", path, strerror(errno));
    wl_buf b = {0};
    char chunk[4096];
    size_t r;
    while ((r = fread(chunk, 1, sizeof chunk, f)) > 0 && b.len < (16u << 20))
        wl_buf_append(&b, chunk, r);
    int bad = ferror(f) || b.len >= (16u << 20);
    fclose(f);
    if (b.failed || bad) {
        free(b.data);
        return wl_fail("%s: cannot read it (or it is over 16 MiB)", path);
    }
    *out = b.data ? b.data : strdup("");
    return *out ? 0 : wl_fail("out of memory");
}

/* A quoted single space followed by '+': the Mistral answer's " " + content. */
static int has_space_literal_plus(const char *t)
{
    for (const char *p = t; (p = strchr(p, ' ')) != NULL; p++) {
        if (p == t || (p[-1] != '\'' && p[-1] != '"') || p[1] != p[-1])
            continue;
        const char *q = p + 2;
        while (*q == ' ')
            q++;
        if (*q == '+')
            return 1;
    }
    return 0;
}

/* Some eos_token in t directly follows "...trim +" or "...strip() +": the
 * answer is trimmed before its end-of-sequence token. */
static int trims_before_eos(const char *t)
{
    for (const char *p = t; (p = strstr(p, "eos_token")) != NULL; p++) {
        const char *q = p;
        while (q > t && (q[-1] == ' ' || q[-1] == '+'))
            q--;
        size_t back = (size_t)(q - t);
        if ((back >= 4 && !strncmp(q - 4, "trim", 4)) ||
            (back >= 7 && !strncmp(q - 7, "strip()", 7)))
            return 1;
    }
    return 0;
}

/* "[INST]" with a space before it inside a string literal (' [INST]'). */
static int inst_lead_space(const char *t)
{
    for (const char *p = t; (p = strstr(p, "[INST]")) != NULL; p++)
        if (p - t >= 2 && p[-1] == ' ' && (p[-2] == '\'' || p[-2] == '"'))
            return 1;
    return 0;
}

/* A Jinja string literal's text, its escapes \n, \t and \\ resolved. */
static char *unescape(const char *s, size_t n)
{
    char *out = malloc(n + 1), *o = out;
    for (size_t i = 0; out && i < n; i++) {
        if (s[i] == '\\' && i + 1 < n && strchr("nt\\", s[i + 1])) {
            i++;
            *o++ = s[i] == 'n' ? '\n' : s[i] == 't' ? '\t' : '\\';
        } else {
            *o++ = s[i];
        }
    }
    if (out)
        *o = 0;
    return out;
}

static int set_variant_chatml(wl_chat *c, const char *t)
{
    c->chatml_bos = strstr(t, "bos_token") != NULL;
    c->tool_response = strstr(t, "<tool_response>") != NULL;
    c->think = strstr(t, "</think>") && strstr(t, "last_query_index");
    /* A default system message is a whole literal turn in the template:
     * '<|im_start|>system\n...<|im_end|>' with no expression inside. */
    static const char *const opens[] = {"<|im_start|>system\\n", "<|im_start|>system\n"};
    for (int k = 0; k < 2; k++)
        for (const char *p = t; (p = strstr(p, opens[k])) != NULL; p++) {
            const char *s = p + strlen(opens[k]), *e = strstr(s, "<|im_end|>");
            if (!e || e == s || strcspn(s, "'\"{}+") < (size_t)(e - s))
                continue;
            if (!(c->default_system = unescape(s, (size_t)(e - s))))
                return wl_fail("out of memory");
            return 0;
        }
    return 0;
}

static int set_variant_llama3(wl_chat *c, const char *t)
{
    c->ipython = strstr(t, "ipython") != NULL;
    c->tool_json = c->ipython && strstr(t, "tojson");
    if (!strstr(t, "Cutting Knowledge Date:"))
        return 0;
    /* the literal is followed by an escaped "\n" or a closing quote */
    char *k = text_after(t, "Cutting Knowledge Date:", "\\\"'\n");
    if (!k || asprintf(&c->knowledge, "Cutting Knowledge Date:%s", k) < 0) {
        free(k);
        c->knowledge = NULL;
        return wl_fail("out of memory");
    }
    free(k);
    c->today = strstr(t, "Today Date:") != NULL;
    if (c->today && !strstr(t, "strftime_now")) { /* transformers defines it: today's date */
        c->fixed_day = text_after(t, "date_string = \"", "\"");
        if (!c->fixed_day)
            c->fixed_day = text_after(t, "date_string = '", "'");
    }
    return 0;
}

static void set_variant_mistral(wl_chat *c, const char *t)
{
    c->inst_lead = inst_lead_space(t);
    c->inst_space = strstr(t, "[INST] ") != NULL;
    c->close_space = strstr(t, " [/INST]") != NULL;
    c->answer_space = has_space_literal_plus(t);
    c->answer_trim = trims_before_eos(t);
    c->system_last = strstr(t, "loop.last and system_message") != NULL;
}

static void not_recognised(wl_chat *c, const char *source, const char *t, const char *why)
{
    char head[48];
    size_t n = 0;
    for (const char *p = t; *p && n + 1 < sizeof head; p++)
        head[n++] = (unsigned char)*p < 0x20 ? ' ' : *p;
    head[n] = 0;
    c->fam = UNKNOWN;
    set_problem(c, "chat template not recognised: %s's template (\"%s%s\") %s " KNOWN, source, head,
                t[n] ? "..." : "", why);
}

/* The family, by its markers, and the details of its version. */
static int classify(wl_chat *c, const char *source, const char *t)
{
    if (strstr(t, "<|im_start|>")) {
        if (strstr(t, "<|im_sep|>")) {
            not_recognised(c, source, t,
                           "separates role and content with <|im_sep|>, not ChatML's newline");
            return 0;
        }
        c->fam = CHATML;
        return set_variant_chatml(c, t);
    }
    if (strstr(t, "<|start_header_id|>") && strstr(t, "<|eot_id|>")) {
        c->fam = LLAMA3;
        return set_variant_llama3(c, t);
    }
    if (strstr(t, "[INST]") && strstr(t, "<<SYS>>")) {
        c->fam = LLAMA2;
        return 0;
    }
    if (strstr(t, "[INST]")) {
        if (strstr(t, "[SYSTEM_PROMPT]")) {
            not_recognised(c, source, t,
                           "has Mistral's [SYSTEM_PROMPT] form, which is not rendered");
            return 0;
        }
        c->fam = MISTRAL;
        set_variant_mistral(c, t);
        return 0;
    }
    not_recognised(c, source, t, "has none of <|im_start|>, <|start_header_id|> or [INST]");
    return 0;
}

static int load(wl_chat *c, const char *model_dir)
{
    char path[4096], jinja[4096];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", model_dir);
    snprintf(jinja, sizeof jinja, "%s/chat_template.jinja", model_dir);
    json_t *root = NULL;
    char *file_text = NULL;
    const char *tmpl = NULL, *source = path;
    int rc = -1;
    struct stat st;
    if (stat(model_dir, &st))
        return wl_fail("%s: %s", model_dir, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return wl_fail("%s: not a folder", model_dir);
    if (access(path, F_OK) == 0) {
        json_error_t jerr;
        if (!(root = json_load_file(path, 0, &jerr))) {
            wl_fail("%s: %s (line %d)", path, jerr.text, jerr.line);
            goto out;
        }
        if (!json_is_object(root)) {
            wl_fail("%s: not a JSON object", path);
            goto out;
        }
        if (token_text(path, root, "bos_token", &c->bos) ||
            token_text(path, root, "eos_token", &c->eos))
            goto out;
    }
    /* transformers prefers a chat_template.jinja file to the config's */
    if (access(jinja, F_OK) == 0) {
        if (read_text(jinja, &file_text))
            goto out;
        tmpl = file_text;
        source = jinja;
    } else if (root && config_template(c, path, root, &tmpl)) {
        goto out;
    }
    if (tmpl && *tmpl) {
        rc = classify(c, source, tmpl);
        goto out;
    }
    c->fam = NO_TEMPLATE;
    if (!c->problem)
        set_problem(
            c,
            "%s: the model has no chat template (no chat_template in tokenizer_config.json, "
            "no chat_template.jinja)",
            model_dir);
    rc = 0;
out:
    json_decref(root);
    free(file_text);
    return rc;
}

int wl_chat_load(wl_chat **out, const char *model_dir)
{
    *out = NULL;
    wl_chat *c = calloc(1, sizeof *c);
    if (!c)
        return wl_fail("out of memory");
    if (load(c, model_dir)) {
        wl_chat_free(c);
        return -1;
    }
    *out = c;
    return 0;
}

void wl_chat_free(wl_chat *c)
{
    if (!c)
        return;
    free(c->problem);
    free(c->bos);
    free(c->eos);
    free(c->default_system);
    free(c->knowledge);
    free(c->fixed_day);
    free(c);
}

const char *wl_chat_family(const wl_chat *c)
{
    return family_names[c->fam];
}

const char *wl_chat_end_of_turn(const wl_chat *c)
{
    switch (c->fam) {
    case CHATML:
        return "<|im_end|>";
    case LLAMA3:
        return "<|eot_id|>";
    case LLAMA2:
    case MISTRAL:
        return c->eos;
    default:
        return NULL;
    }
}

/* ---- the messages ------------------------------------------------------------- */

static const char *type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
    case JSON_REAL:
        return "a number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "a boolean";
    case JSON_NULL:
        return "null";
    }
    return "?";
}

static int parse_content(size_t i, json_t *content, wl_buf *b)
{
    if (json_is_string(content)) {
        wl_buf_append(b, json_string_value(content), json_string_length(content));
        return 0;
    }
    if (!json_is_array(content))
        return wl_fail("messages[%zu].content is %s, not a string or an array of parts", i,
                       type_name(content));
    size_t k;
    json_t *part;
    json_array_foreach(content, k, part)
    {
        if (!json_is_object(part))
            return wl_fail("messages[%zu].content[%zu] is %s, not a part object", i, k,
                           type_name(part));
        json_t *type = json_object_get(part, "type"), *text = json_object_get(part, "text");
        if (!json_is_string(type))
            return wl_fail("messages[%zu].content[%zu] has no string \"type\"", i, k);
        if (strcmp(json_string_value(type), "text"))
            return wl_fail("messages[%zu].content[%zu] is of type \"%s\": only \"text\" parts "
                           "can be rendered",
                           i, k, json_string_value(type));
        if (!json_is_string(text))
            return wl_fail("messages[%zu].content[%zu] is a text part whose \"text\" is not a "
                           "string",
                           i, k);
        wl_buf_append(b, json_string_value(text), json_string_length(text));
    }
    return 0;
}

static int parse_message(size_t i, json_t *m, msg *out)
{
    if (!json_is_object(m))
        return wl_fail("messages[%zu] is %s, not an object", i, type_name(m));
    json_t *r = json_object_get(m, "role"), *content = json_object_get(m, "content");
    json_t *calls = json_object_get(m, "tool_calls");
    if (!r)
        return wl_fail("messages[%zu] has no role", i);
    if (!json_is_string(r))
        return wl_fail("messages[%zu].role is %s, not a string", i, type_name(r));
    const char *name = json_string_value(r);
    if (!strcmp(name, "developer")) { /* OpenAI's newer name for the system role */
        out->role = SYSTEM;
    } else {
        size_t k;
        for (k = 0; k < 4 && strcmp(name, wl_ct_role_names[k]); k++)
            ;
        if (k == 4)
            return wl_fail("messages[%zu].role \"%s\" is not system, user, assistant, tool or "
                           "developer",
                           i, name);
        out->role = (role)k;
    }
    if (calls && !json_is_null(calls) && !(json_is_array(calls) && !json_array_size(calls)))
        return wl_fail("messages[%zu] carries tool_calls, which chat rendering does not support",
                       i);
    if (!content)
        return wl_fail("messages[%zu] has no content", i);
    wl_buf b = {0};
    if (parse_content(i, content, &b)) {
        free(b.data);
        return -1;
    }
    if (b.failed) {
        free(b.data);
        return wl_fail("out of memory");
    }
    if (b.data && memchr(b.data, 0, b.len)) {
        free(b.data);
        return wl_fail("messages[%zu].content holds a NUL character", i);
    }
    out->text = b.data ? b.data : strdup("");
    out->len = b.len;
    return out->text ? 0 : wl_fail("out of memory");
}

static int parse_messages(json_t *messages, msg **out, size_t *n)
{
    if (!messages || !json_is_array(messages))
        return wl_fail("messages is %s, not an array", messages ? type_name(messages) : "missing");
    *n = json_array_size(messages);
    if (!*n)
        return wl_fail("messages is empty");
    if (!(*out = calloc(*n, sizeof **out)))
        return wl_fail("out of memory");
    for (size_t i = 0; i < *n; i++)
        if (parse_message(i, json_array_get(messages, i), &(*out)[i]))
            return -1;
    return 0;
}

int wl_chat_render(const wl_chat *c, json_t *messages, int add_generation_prompt, char **text,
                   int *add_special)
{
    *text = NULL;
    if (c->fam == NO_TEMPLATE || c->fam == UNKNOWN)
        return wl_fail("%s", c->problem ? c->problem : "out of memory");
    msg *m = NULL;
    size_t n = 0;
    wl_buf b = {0};
    int bos = -1;
    if (!parse_messages(messages, &m, &n)) {
        switch (c->fam) {
        case CHATML:
            bos = wl_ct_chatml(c, m, n, add_generation_prompt, &b);
            break;
        case LLAMA3:
            bos = wl_ct_llama3(c, m, n, add_generation_prompt, &b);
            break;
        case LLAMA2: /* the [INST] formats end where the answer starts */
            bos = wl_ct_llama2(c, m, n, &b);
            break;
        case MISTRAL:
            bos = wl_ct_mistral(c, m, n, &b);
            break;
        default:
            break;
        }
    }
    for (size_t i = 0; m && i < n; i++)
        free(m[i].text);
    free(m);
    if (bos >= 0 && b.failed)
        bos = wl_fail("out of memory");
    if (bos < 0) {
        free(b.data);
        return -1;
    }
    *text = b.data ? b.data : strdup("");
    if (!*text)
        return wl_fail("out of memory");
    *add_special = !bos;
    return 0;
}
