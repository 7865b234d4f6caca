/*
 * chat_format.c - the chat formats that chat.c recognises, written here
 * from what each family's templates produce (see chat.c: no Jinja is run).
 * Whitespace is trimmed where those templates trim it (Jinja's trim and
 * Python's strip(), Unicode whitespace included), nowhere else.
 */
#include <stdio.h>
#include <time.h>

#include "chat_impl.h"

const char *const wl_ct_role_names[] = {"system", "user", "assistant", "tool"};

/* Length of the whitespace character (as Python's str.isspace, which
 * Jinja's trim and Python's strip() use) starting at s, or 0. */
static size_t space_at(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    if (n >= 1 && ((u[0] >= 0x09 && u[0] <= 0x0d) || (u[0] >= 0x1c && u[0] <= 0x20)))
        return 1;
    if (n >= 2 && u[0] == 0xc2 && (u[1] == 0x85 || u[1] == 0xa0))
        return 2;
    if (n >= 3 && u[0] == 0xe1 && u[1] == 0x9a && u[2] == 0x80) /* U+1680 */
        return 3;
    if (n >= 3 && u[0] == 0xe2 && u[1] == 0x80 &&
        (u[2] <= 0x8a || u[2] == 0xa8 || u[2] == 0xa9 || u[2] == 0xaf)) /* U+2000-200A, 2028... */
        return 3;
    if (n >= 3 && u[0] == 0xe2 && u[1] == 0x81 && u[2] == 0x9f) /* U+205F */
        return 3;
    if (n >= 3 && u[0] == 0xe3 && u[1] == 0x80 && u[2] == 0x80) /* U+3000 */
        return 3;
    return 0;
}

/* [s, s + n) less its leading and trailing whitespace (Python's strip()). */
static void strip(const char **s, size_t *n)
{
    size_t k;
    while (*n && (k = space_at(*s, *n)) > 0) {
        *s += k;
        *n -= k;
    }
    while (*n) {
        size_t start = *n - 1; /* the last character's first byte */
        while (start > 0 && ((unsigned char)(*s)[start] & 0xc0) == 0x80 && *n - start < 3)
            start--;
        if (space_at(*s + start, *n - start) != *n - start)
            break;
        *n = start;
    }
}

static void put_stripped(wl_buf *b, const char *s, size_t n)
{
    strip(&s, &n);
    wl_buf_append(b, s, n);
}

/* Python's json.dumps(s, ensure_ascii=False): what transformers' tojson
 * filter writes for a string. */
static void put_json_string(wl_buf *b, const char *s, size_t n)
{
    wl_buf_append(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        const char *esc = NULL;
        char u[8];
        switch (ch) {
        case '"':
            esc = "\\\"";
            break;
        case '\\':
            esc = "\\\\";
            break;
        case '\n':
            esc = "\\n";
            break;
        case '\r':
            esc = "\\r";
            break;
        case '\t':
            esc = "\\t";
            break;
        case '\b':
            esc = "\\b";
            break;
        case '\f':
            esc = "\\f";
            break;
        default:
            if (ch < 0x20) {
                snprintf(u, sizeof u, "\\u%04x", ch);
                esc = u;
            }
        }
        if (esc)
            wl_buf_puts(b, esc);
        else
            wl_buf_append(b, s + i, 1);
    }
    wl_buf_append(b, "\"", 1);
}

static int starts_with(const msg *m, const char *s)
{
    size_t l = strlen(s);
    return m->len >= l && !memcmp(m->text, s, l);
}

static int ends_with(const msg *m, const char *s)
{
    size_t l = strlen(s);
    return m->len >= l && !memcmp(m->text + m->len - l, s, l);
}

static const char *last_of(const char *s, size_t n, const char *needle)
{
    const char *found = NULL;
    size_t l = strlen(needle);
    for (size_t i = 0; i + l <= n; i++)
        if (!memcmp(s + i, needle, l))
            found = s + i;
    return found;
}

static void trim_newlines(const char **s, size_t *n, int lead, int trail)
{
    while (lead && *n && **s == '\n') {
        (*s)++;
        (*n)--;
    }
    while (trail && *n && (*s)[*n - 1] == '\n')
        (*n)--;
}

/* Qwen3's assistant turn: a reasoning block "<think>...</think>" is split
 * off; it is written back only after the last user query, and for the
 * last message always (empty then). */
static void put_think_turn(wl_buf *b, const msg *m, int after_query, int last)
{
    const char *content = m->text, *reason = "";
    size_t clen = m->len, rlen = 0;
    const char *close = strstr(m->text, "</think>");
    if (close) {
        /* reasoning: before the first </think>, after the last <think> there */
        reason = m->text;
        rlen = (size_t)(close - m->text);
        trim_newlines(&reason, &rlen, 0, 1);
        const char *open = last_of(reason, rlen, "<think>");
        if (open) {
            rlen -= (size_t)(open + 7 - reason);
            reason = open + 7;
        }
        trim_newlines(&reason, &rlen, 1, 0);
        /* content: after the last </think> */
        const char *after = last_of(m->text, m->len, "</think>") + 8;
        clen = m->len - (size_t)(after - m->text);
        content = after;
        trim_newlines(&content, &clen, 1, 0);
    }
    wl_buf_puts(b, "<|im_start|>assistant\n");
    if (after_query && (last || rlen)) {
        trim_newlines(&reason, &rlen, 1, 1);
        wl_buf_puts(b, "<think>\n");
        wl_buf_append(b, reason, rlen);
        wl_buf_puts(b, "\n</think>\n\n");
        trim_newlines(&content, &clen, 1, 0);
    }
    wl_buf_append(b, content, clen);
    wl_buf_puts(b, "<|im_end|>\n");
}

int wl_ct_chatml(const wl_chat *c, const msg *m, size_t n, int gen, wl_buf *b)
{
    int bos = c->chatml_bos && c->bos && *c->bos;
    if (bos)
        wl_buf_puts(b, c->bos);
    if (c->default_system && m[0].role != SYSTEM) {
        wl_buf_puts(b, "<|im_start|>system\n");
        wl_buf_puts(b, c->default_system);
        wl_buf_puts(b, "<|im_end|>\n");
    }
    size_t query = n - 1; /* Qwen3: the last user message that is not tool output */
    for (size_t i = n; c->think && i-- > 0;)
        if (m[i].role == USER &&
            !(starts_with(&m[i], "<tool_response>") && ends_with(&m[i], "</tool_response>"))) {
            query = i;
            break;
        }
    for (size_t i = 0; i < n; i++) {
        if (m[i].role == TOOL && c->tool_response) {
            if (i == 0 || m[i - 1].role != TOOL)
                wl_buf_puts(b, "<|im_start|>user");
            wl_buf_puts(b, "\n<tool_response>\n");
            wl_buf_append(b, m[i].text, m[i].len);
            wl_buf_puts(b, "\n</tool_response>");
            if (i + 1 == n || m[i + 1].role != TOOL)
                wl_buf_puts(b, "<|im_end|>\n");
        } else if (m[i].role == ASSISTANT && c->think) {
            put_think_turn(b, &m[i], i > query, i + 1 == n);
        } else {
            wl_buf_puts(b, "<|im_start|>");
            wl_buf_puts(b, wl_ct_role_names[m[i].role]);
            wl_buf_puts(b, "\n");
            wl_buf_append(b, m[i].text, m[i].len);
            wl_buf_puts(b, "<|im_end|>\n");
        }
    }
    if (gen)
        wl_buf_puts(b, "<|im_start|>assistant\n");
    return bos;
}

/* Python's datetime.now().strftime("%d %b %Y") in the C locale. */
static void today(char out[16])
{
    static const char *const months[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                         "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    snprintf(out, 16, "%02d %s %d", tm.tm_mday, months[tm.tm_mon], tm.tm_year + 1900);
}

static void header(wl_buf *b, const char *name)
{
    wl_buf_puts(b, "<|start_header_id|>");
    wl_buf_puts(b, name);
    wl_buf_puts(b, "<|end_header_id|>\n\n");
}

int wl_ct_llama3(const wl_chat *c, const msg *m, size_t n, int gen, wl_buf *b)
{
    if (c->bos)
        wl_buf_puts(b, c->bos);
    size_t i = 0;
    if (c->knowledge) { /* 3.1 and later: the system header is always there */
        header(b, "system");
        wl_buf_puts(b, c->knowledge);
        wl_buf_puts(b, "\n");
        if (c->today) {
            char day[16];
            today(day);
            wl_buf_puts(b, "Today Date: ");
            wl_buf_puts(b, c->fixed_day ? c->fixed_day : day);
            wl_buf_puts(b, "\n");
        }
        wl_buf_puts(b, "\n");
        if (m[0].role == SYSTEM) {
            put_stripped(b, m[0].text, m[0].len);
            i = 1;
        }
        wl_buf_puts(b, "<|eot_id|>");
    }
    for (; i < n; i++) {
        if (m[i].role == TOOL && c->ipython) {
            header(b, "ipython");
            if (c->tool_json) /* a string "is iterable" there, so it goes through tojson */
                put_json_string(b, m[i].text, m[i].len);
            else
                wl_buf_append(b, m[i].text, m[i].len);
        } else {
            header(b, wl_ct_role_names[m[i].role]);
            put_stripped(b, m[i].text, m[i].len);
        }
        wl_buf_puts(b, "<|eot_id|>");
    }
    if (gen)
        header(b, "assistant");
    return c->bos && *c->bos;
}

/* The [INST] formats: an optional system message first, then user and
 * assistant turns alternating, starting with the user. */
static int check_inst_roles(const char *fam, const msg *m, size_t n, size_t *first)
{
    *first = m[0].role == SYSTEM;
    if (*first == n)
        return wl_fail("the %s format needs a user message after the system message", fam);
    for (size_t i = *first; i < n; i++) {
        if (m[i].role == SYSTEM)
            return wl_fail("messages[%zu]: the %s format takes a system message only first", i,
                           fam);
        if (m[i].role == TOOL)
            return wl_fail("messages[%zu]: the %s format has no tool role", i, fam);
        role want = (i - *first) % 2 ? ASSISTANT : USER;
        if (m[i].role != want)
            return wl_fail("messages[%zu] is %s where the %s format needs %s: after an optional "
                           "system message, turns alternate user, assistant, user, ...",
                           i, wl_ct_role_names[m[i].role], fam, wl_ct_role_names[want]);
    }
    return 0;
}

int wl_ct_llama2(const wl_chat *c, const msg *m, size_t n, wl_buf *b)
{
    size_t first;
    if (check_inst_roles("Llama 2", m, n, &first))
        return -1;
    const char *bos = c->bos ? c->bos : "", *eos = c->eos ? c->eos : "";
    for (size_t i = first; i < n; i++) {
        wl_buf turn = {0};
        if (i == first && first) {
            wl_buf_puts(&turn, "<<SYS>>\n");
            wl_buf_append(&turn, m[0].text, m[0].len);
            wl_buf_puts(&turn, "\n<</SYS>>\n\n");
        }
        wl_buf_append(&turn, m[i].text, m[i].len);
        if (turn.failed) {
            free(turn.data);
            return wl_fail("out of memory");
        }
        if (m[i].role == USER) {
            wl_buf_puts(b, bos);
            wl_buf_puts(b, "[INST] ");
            put_stripped(b, turn.data, turn.len);
            wl_buf_puts(b, " [/INST]");
        } else {
            wl_buf_puts(b, " ");
            put_stripped(b, turn.data, turn.len);
            wl_buf_puts(b, " ");
            wl_buf_puts(b, eos);
        }
        free(turn.data);
    }
    return c->bos && *c->bos;
}

/* The system prompt goes into the first user turn, or (the later form)
 * into the last message when that is a user turn: a conversation that
 * ends with an answer then has none, as its template renders it. */
int wl_ct_mistral(const wl_chat *c, const msg *m, size_t n, wl_buf *b)
{
    size_t first;
    if (check_inst_roles("Mistral", m, n, &first))
        return -1;
    if (c->bos)
        wl_buf_puts(b, c->bos);
    for (size_t i = first; i < n; i++) {
        if (m[i].role == USER) {
            wl_buf_puts(b, c->inst_lead ? " [INST]" : "[INST]");
            wl_buf_puts(b, c->inst_space ? " " : "");
            if (first && (c->system_last ? i + 1 == n : i == first)) {
                wl_buf_append(b, m[0].text, m[0].len);
                wl_buf_puts(b, "\n\n");
            }
            wl_buf_append(b, m[i].text, m[i].len);
            wl_buf_puts(b, c->close_space ? " [/INST]" : "[/INST]");
        } else {
            wl_buf_puts(b, c->answer_space ? " " : "");
            if (c->answer_trim)
                put_stripped(b, m[i].text, m[i].len);
            else
                wl_buf_append(b, m[i].text, m[i].len);
            wl_buf_puts(b, c->eos ? c->eos : "");
        }
    }
    return c->bos && *c->bos;
}
