/*
 * chat_impl.h - what chat.c (the template's family, read from its text,
 * and the messages, checked) and chat_format.c (each family's format)
 * share.
 */
#ifndef WL_CHAT_IMPL_H
#define WL_CHAT_IMPL_H

#include <stdlib.h>
#include <string.h>

#include "llm.h"

typedef enum family { NO_TEMPLATE, UNKNOWN, CHATML, LLAMA3, LLAMA2, MISTRAL } family;

struct wl_chat {
    family fam;
    char *problem;   /* NO_TEMPLATE, UNKNOWN: what rendering says */
    char *bos, *eos; /* tokenizer_config's texts; NULL when not given */
    /* ChatML */
    int chatml_bos;       /* the template writes bos_token first */
    char *default_system; /* written when the first message is not a system one */
    int tool_response;    /* tool results as <tool_response> blocks in a user turn (Qwen) */
    int think;            /* Qwen3: reasoning kept only after the last user query */
    /* Llama 3.1 and later: a system header with dates, always written */
    char *knowledge; /* "Cutting Knowledge Date: ..." */
    int today;       /* a "Today Date: " line ... */
    char *fixed_day; /* ... of this date, or today's when NULL */
    int ipython;     /* tool results under the ipython role ... */
    int tool_json;   /* ... as a JSON string */
    /* Mistral */
    int inst_lead, inst_space, close_space; /* " [INST]", "[INST] ", " [/INST]" */
    int answer_space, answer_trim;          /* " " + answer, answer|trim */
    int system_last;                        /* system into the last user turn, not the first */
};

typedef enum role { SYSTEM, USER, ASSISTANT, TOOL } role;

typedef struct msg {
    role role;
    char *text; /* content, text parts joined; NUL-free */
    size_t len;
} msg;

/* The formats (chat_format.c): n >= 1 checked messages into b. Each
 * returns 1 when the text opens with the BOS, 0 when not, -1 (wl_fail)
 * when the messages do not fit the format. */
extern const char *const wl_ct_role_names[];
int wl_ct_chatml(const wl_chat *c, const msg *m, size_t n, int gen, wl_buf *b);
int wl_ct_llama3(const wl_chat *c, const msg *m, size_t n, int gen, wl_buf *b);
int wl_ct_llama2(const wl_chat *c, const msg *m, size_t n, wl_buf *b);
int wl_ct_mistral(const wl_chat *c, const msg *m, size_t n, wl_buf *b);

#endif
