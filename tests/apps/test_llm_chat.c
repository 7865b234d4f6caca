/*
 * test_llm_chat.c - weft-llm's chat templates (chat.c, chat_format.c).
 * Every family is rendered from templates in its shape and compared with
 * what Jinja renders for the same templates and conversations
 * (data/chat_cases.json, written by chat_cases.py with jinja2 as
 * transformers runs it); then the details read from a template's text
 * that the cases cannot hold (today's date, a named template list, a
 * chat_template.jinja file, bos_token as an object), every refusal by its
 * message, and the random model's ChatML: its markers encode to single
 * ids, <|im_end|> ends generation, and no other id moved.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <sys/stat.h>
#include <cmocka.h>

#include <jansson.h>

#include "llm_test.h"

static char *dir;
static int folders;

static int setup(void **state)
{
    (void)state;
    dir = scratch_dir();
    return dir ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    remove_scratch(dir);
    free(dir);
    return 0;
}

/* A new model folder in the scratch folder; config (stolen), when given,
 * is written as its tokenizer_config.json. */
static char *model_folder(json_t *config)
{
    char name[32];
    snprintf(name, sizeof name, "m%d", folders++);
    char *d = path_in(dir, name);
    assert_int_equal(mkdir(d, 0777), 0);
    if (config) {
        char *p = path_in(d, "tokenizer_config.json");
        assert_int_equal(json_dump_file(config, p, JSON_INDENT(1)), 0);
        json_decref(config);
        free(p);
    }
    return d;
}

static wl_chat *load_ok(const char *d)
{
    wl_chat *c = NULL;
    if (wl_chat_load(&c, d))
        fail_msg("%s: %s", d, wl_error());
    return c;
}

/* JSON written with ' for " (none of these texts has an apostrophe). */
static json_t *js(const char *text)
{
    char *t = strdup(text);
    for (char *p = t; *p; p++)
        if (*p == '\'')
            *p = '"';
    json_error_t e;
    json_t *v = json_loads(t, JSON_DECODE_ANY | JSON_ALLOW_NUL, &e);
    if (!v)
        fail_msg("test JSON %s: %s", text, e.text);
    free(t);
    return v;
}

static wl_chat *chat_of(const char *tmpl, const char *bos, const char *eos)
{
    json_t *cfg = json_pack("{s:s}", "chat_template", tmpl);
    if (bos)
        json_object_set_new(cfg, "bos_token", json_string(bos));
    if (eos)
        json_object_set_new(cfg, "eos_token", json_string(eos));
    char *d = model_folder(cfg);
    wl_chat *c = load_ok(d);
    free(d);
    return c;
}

/* Renders; the outputs are poisoned first and must be written. */
static char *render_ok(const wl_chat *c, const char *messages, int gen, int want_special)
{
    json_t *m = js(messages);
    char *text = (char *)&folders;
    int special = -7;
    if (wl_chat_render(c, m, gen, &text, &special))
        fail_msg("%s: %s", messages, wl_error());
    assert_int_equal(special, want_special);
    assert_true(text != (char *)&folders);
    json_decref(m);
    return text;
}

static void expect_text(const wl_chat *c, const char *messages, int gen, int want_special,
                        const char *want)
{
    char *text = render_ok(c, messages, gen, want_special);
    if (strcmp(text, want))
        fail_msg("rendered\n\"%s\"\nwanted\n\"%s\"", text, want);
    free(text);
}

static void expect_error_json(const wl_chat *c, json_t *m, const char *message)
{
    char *text = (char *)&folders;
    int special = -7;
    assert_int_equal(wl_chat_render(c, m, 1, &text, &special), -1);
    printf("  -> %s\n", wl_error());
    if (!strstr(wl_error(), message))
        fail_msg("expected \"%s\" in \"%s\"", message, wl_error());
    assert_null(text);
    assert_int_equal(special, -7);
}

static void expect_error(const wl_chat *c, const char *messages, const char *message)
{
    json_t *m = messages ? js(messages) : NULL;
    expect_error_json(c, m, message);
    json_decref(m);
}

/* ---- every family against Jinja ------------------------------------------ */

static const struct {
    const char *name, *family;
} families[] = {
    {"chatml", "ChatML"},        {"qwen2", "ChatML"},       {"qwen3", "ChatML"},
    {"chatml_bos", "ChatML"},    {"llama3", "Llama 3"},     {"llama31", "Llama 3"},
    {"llama2", "Llama 2"},       {"mistral_v1", "Mistral"}, {"mistral_v3", "Mistral"},
    {"mistral_nemo", "Mistral"},
};

/* The OpenAI messages of a conversation given as [[role, content], ...]. */
static json_t *messages_of(json_t *conversation)
{
    json_t *out = json_array(), *turn;
    size_t i;
    json_array_foreach(conversation, i, turn)
    {
        json_array_append_new(out, json_pack("{s:O, s:O}", "role", json_array_get(turn, 0),
                                             "content", json_array_get(turn, 1)));
    }
    return out;
}

static void test_families_render_as_jinja_does(void **state)
{
    (void)state;
    json_error_t e;
    json_t *data = json_load_file(WL_DATA_DIR "/chat_cases.json", 0, &e);
    if (!data)
        fail_msg("chat_cases.json: %s", e.text);
    json_t *templates = json_object_get(data, "templates"),
           *conversations = json_object_get(data, "conversations");
    int rendered = 0, refused = 0;
    for (size_t f = 0; f < sizeof families / sizeof *families; f++) {
        json_t *t = json_object_get(templates, families[f].name);
        assert_non_null(t);
        json_t *cfg = json_deep_copy(t);
        json_object_set(cfg, "chat_template", json_object_get(t, "template"));
        json_object_del(cfg, "template");
        char *d = model_folder(cfg);
        wl_chat *c = load_ok(d);
        assert_string_equal(wl_chat_family(c), families[f].family);
        size_t i;
        json_t *k;
        json_array_foreach(json_object_get(data, "cases"), i, k)
        {
            if (strcmp(json_string_value(json_object_get(k, "template")), families[f].name))
                continue;
            const char *conv = json_string_value(json_object_get(k, "conversation"));
            int gen = json_is_true(json_object_get(k, "add_generation_prompt"));
            json_t *m = messages_of(json_object_get(conversations, conv));
            char *text = (char *)&folders;
            int special = -7, rc = wl_chat_render(c, m, gen, &text, &special);
            if (json_is_true(json_object_get(k, "error"))) {
                if (rc != -1 || text || special != -7)
                    fail_msg("%s, %s: rendered where it should be refused", families[f].name, conv);
                refused++;
            } else {
                if (rc)
                    fail_msg("%s, %s: %s", families[f].name, conv, wl_error());
                const char *want = json_string_value(json_object_get(k, "text"));
                if (strcmp(text, want))
                    fail_msg("%s, %s, generation prompt %d: rendered\n\"%s\"\nJinja:\n\"%s\"",
                             families[f].name, conv, gen, text, want);
                assert_int_equal(special, json_integer_value(json_object_get(k, "add_special")));
                free(text);
                rendered++;
            }
            json_decref(m);
        }
        wl_chat_free(c);
        free(d);
    }
    printf("  %d cases rendered as Jinja renders them, %d refused\n", rendered, refused);
    assert_int_equal(rendered + refused, json_array_size(json_object_get(data, "cases")));
    json_decref(data);
}

/* ---- details read from the template's text ---------------------------------- */

/* The shape of Llama 3.2's header: today's date from strftime_now. */
static void test_llama3_header_with_todays_date(void **state)
{
    (void)state;
    wl_chat *c = chat_of(
        "{{- bos_token }}{%- if strftime_now is defined %}{%- set date_string = "
        "strftime_now('%d %b %Y') %}{%- else %}{%- set date_string = '26 Jul 2024' %}{%- endif "
        "%}{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}{{- 'Cutting Knowledge Date: "
        "March 2020\\n' }}{{- 'Today Date: ' + date_string + '\\n\\n' }}{%- for message in "
        "messages %}{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' + "
        "message.content | trim + '<|eot_id|>' }}{%- endfor %}",
        "<|begin_of_text|>", "<|eot_id|>");
    char before[32], after[32], want[2][256];
    time_t now = time(NULL);
    strftime(before, sizeof before, "%d %b %Y", localtime(&now));
    char *text = render_ok(c, "[{'role': 'user', 'content': 'Hi'}]", 0, 0);
    now = time(NULL);
    strftime(after, sizeof after, "%d %b %Y", localtime(&now));
    for (int k = 0; k < 2; k++)
        snprintf(want[k], sizeof want[k],
                 "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting "
                 "Knowledge Date: March 2020\nToday Date: %s\n\n<|eot_id|><|start_header_id|>"
                 "user<|end_header_id|>\n\nHi<|eot_id|>",
                 k ? after : before);
    printf("  %s\n", text);
    if (strcmp(text, want[0]) && strcmp(text, want[1]))
        fail_msg("rendered \"%s\"\nwanted \"%s\"", text, want[0]);
    free(text);
    wl_chat_free(c);
}

static const char chatml[] = "{%- for message in messages %}{{- '<|im_start|>' + message.role + "
                             "'\\n' + message.content + '<|im_end|>\\n' }}{%- endfor %}";
static const char llama3[] = "{% for message in messages %}{{ '<|start_header_id|>' + "
                             "message.role + '<|end_header_id|>\\n\\n' + message.content | trim + "
                             "'<|eot_id|>' }}{% endfor %}";

static void test_where_the_template_comes_from(void **state)
{
    (void)state;
    /* a list of named templates: the default one */
    char *d =
        model_folder(json_pack("{s:[{s:s, s:s}, {s:s, s:s}]}", "chat_template", "name", "tool_use",
                               "template", llama3, "name", "default", "template", chatml));
    wl_chat *c = load_ok(d);
    assert_string_equal(wl_chat_family(c), "ChatML");
    assert_string_equal(wl_chat_end_of_turn(c), "<|im_end|>");
    wl_chat_free(c);
    /* chat_template.jinja wins over the config's */
    char *j = path_in(d, "chat_template.jinja");
    assert_int_equal(write_bytes(j, llama3, strlen(llama3)), 0);
    c = load_ok(d);
    assert_string_equal(wl_chat_family(c), "Llama 3");
    assert_string_equal(wl_chat_end_of_turn(c), "<|eot_id|>");
    wl_chat_free(c);
    free(j);
    free(d);
    /* bos_token and eos_token as AddedToken objects; a BOS in the text */
    d = model_folder(json_pack("{s:s, s:{s:s, s:s}, s:{s:s}}", "chat_template", llama3, "bos_token",
                               "__type", "AddedToken", "content", "<|bos|>", "eos_token", "content",
                               "<|eos|>"));
    c = load_ok(d);
    expect_text(c, "[{'role': 'user', 'content': ' Hi '}]", 1, 0,
                "<|bos|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                "<|start_header_id|>assistant<|end_header_id|>\n\n");
    wl_chat_free(c);
    free(d);
    /* no bos_token: no BOS in the text, the tokenizer is to add its own */
    c = chat_of(llama3, NULL, NULL);
    expect_text(c, "[{'role': 'user', 'content': 'Hi'}]", 0, 1,
                "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>");
    wl_chat_free(c);
    c = chat_of("{% if messages[0]['role'] == 'system' %}<<SYS>>{% endif %}{{ bos_token + "
                "'[INST] ' + m + ' [/INST]' }}",
                NULL, NULL);
    expect_text(c, "[{'role': 'system', 'content': 'S'}, {'role': 'user', 'content': 'U'}]", 1, 1,
                "[INST] <<SYS>>\nS\n<</SYS>>\n\nU [/INST]");
    assert_null(wl_chat_end_of_turn(c)); /* no eos_token */
    wl_chat_free(c);
    /* a default system message whose literal holds escapes */
    c = chat_of("{%- if messages[0].role != 'system' %}{{- '<|im_start|>system\\nOne\\ttwo\\n"
                "three<|im_end|>\\n' }}{%- endif %}{%- for message in messages %}{{- "
                "'<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
                "{%- endfor %}",
                NULL, NULL);
    expect_text(c, "[{'role': 'user', 'content': 'U'}]", 0, 1,
                "<|im_start|>system\nOne\ttwo\nthree<|im_end|>\n<|im_start|>user\nU<|im_end|>\n");
    wl_chat_free(c);
}

/* ---- refusals ------------------------------------------------------------------ */

static void test_messages_refused_by_their_message(void **state)
{
    (void)state;
    wl_chat *c = chat_of(chatml, NULL, NULL);
    expect_error(c, NULL, "messages is missing, not an array");
    expect_error(c, "{'role': 'user'}", "messages is an object, not an array");
    expect_error(c, "'hi'", "messages is a string, not an array");
    expect_error(c, "[]", "messages is empty");
    expect_error(c, "[3]", "messages[0] is a number, not an object");
    expect_error(c, "[{'content': 'hi'}]", "messages[0] has no role");
    expect_error(c, "[{'role': 'user', 'content': 'a'}, {'role': 7, 'content': 'hi'}]",
                 "messages[1].role is a number, not a string");
    expect_error(c, "[{'role': 'narrator', 'content': 'hi'}]",
                 "messages[0].role \"narrator\" is not system, user, assistant, tool or "
                 "developer");
    expect_error(c, "[{'role': 'user'}]", "messages[0] has no content");
    expect_error(c, "[{'role': 'user', 'content': null}]",
                 "messages[0].content is null, not a string or an array of parts");
    expect_error(c, "[{'role': 'user', 'content': 5}]",
                 "messages[0].content is a number, not a string or an array of parts");
    expect_error(c, "[{'role': 'user', 'content': {'type': 'text', 'text': 'a'}}]",
                 "messages[0].content is an object, not a string or an array of parts");
    expect_error(c, "[{'role': 'user', 'content': ['a']}]",
                 "messages[0].content[0] is a string, not a part object");
    expect_error(c, "[{'role': 'user', 'content': [{'text': 'a'}]}]",
                 "messages[0].content[0] has no string \"type\"");
    expect_error(c,
                 "[{'role': 'user', 'content': [{'type': 'text', 'text': 'a'}, {'type': "
                 "'image_url', 'image_url': {'url': 'x'}}]}]",
                 "messages[0].content[1] is of type \"image_url\": only \"text\" parts can be "
                 "rendered");
    expect_error(c, "[{'role': 'user', 'content': [{'type': 'text', 'text': 3}]}]",
                 "messages[0].content[0] is a text part whose \"text\" is not a string");
    expect_error(c, "[{'role': 'user', 'content': 'a\\u0000b'}]",
                 "messages[0].content holds a NUL character");
    expect_error(c,
                 "[{'role': 'user', 'content': 'hi'}, {'role': 'assistant', 'content': null, "
                 "'tool_calls': [{'id': 'x', 'type': 'function'}]}]",
                 "messages[1] carries tool_calls, which chat rendering does not support");
    /* an empty tool_calls list is no call */
    expect_text(c, "[{'role': 'assistant', 'content': 'a', 'tool_calls': []}]", 0, 1,
                "<|im_start|>assistant\na<|im_end|>\n");
    wl_chat_free(c);

    /* the [INST] formats' roles */
    c = chat_of("[INST] <<SYS>>", "<s>", "</s>");
    expect_error(c, "[{'role': 'system', 'content': 'S'}]",
                 "the Llama 2 format needs a user message after the system message");
    expect_error(c, "[{'role': 'assistant', 'content': 'A'}]",
                 "messages[0] is assistant where the Llama 2 format needs user");
    expect_error(c, "[{'role': 'user', 'content': 'U'}, {'role': 'user', 'content': 'U'}]",
                 "messages[1] is user where the Llama 2 format needs assistant");
    expect_error(c, "[{'role': 'user', 'content': 'U'}, {'role': 'developer', 'content': 'S'}]",
                 "messages[1]: the Llama 2 format takes a system message only first");
    wl_chat_free(c);
    c = chat_of("[INST]", "<s>", "</s>");
    expect_error(c,
                 "[{'role': 'user', 'content': 'U'}, {'role': 'assistant', 'content': 'A'}, "
                 "{'role': 'tool', 'content': 'T'}]",
                 "messages[2]: the Mistral format has no tool role");
    wl_chat_free(c);
}

static void expect_load_error(json_t *config, const char *message)
{
    char *d = model_folder(config);
    wl_chat *c = (wl_chat *)&folders;
    assert_int_equal(wl_chat_load(&c, d), -1);
    assert_null(c);
    printf("  -> %s\n", wl_error());
    if (!strstr(wl_error(), message))
        fail_msg("expected \"%s\" in \"%s\"", message, wl_error());
    free(d);
}

/* A template that loads and cannot be rendered. */
static void expect_unrenderable(const char *d, const char *message)
{
    wl_chat *c = load_ok(d);
    assert_null(wl_chat_family(c));
    assert_null(wl_chat_end_of_turn(c));
    expect_error(c, "[{'role': 'user', 'content': 'hi'}]", message);
    wl_chat_free(c);
}

static void test_templates_refused_by_their_message(void **state)
{
    (void)state;
    char *d = model_folder(NULL);
    expect_unrenderable(d, "the model has no chat template");
    free(d);
    d = model_folder(json_pack("{s:s}", "bos_token", "<s>"));
    expect_unrenderable(d, "the model has no chat template");
    free(d);
    d = model_folder(json_pack("{s:s}", "chat_template", ""));
    expect_unrenderable(d, "the model has no chat template");
    free(d);
    d = model_folder(json_pack("{s:[{s:s, s:s}, {s:s, s:s}]}", "chat_template", "name", "tool_use",
                               "template", chatml, "name", "rag", "template", chatml));
    expect_unrenderable(
        d, "chat_template lists templates (\"tool_use\", \"rag\") but none named \"default\"");
    free(d);
    /* Gemma's turns, Phi-4's <|im_sep|>, Mistral's [SYSTEM_PROMPT] */
    d = model_folder(json_pack("{s:s}", "chat_template",
                               "{% for m in messages %}<start_of_turn>{{ m.role }}\n{{ m.content "
                               "}}<end_of_turn>\n{% endfor %}"));
    expect_unrenderable(d, "chat template not recognised: ");
    expect_unrenderable(d, "(\"{% for m in messages %}<start_of_turn>{{ m.role...\") has none of "
                           "<|im_start|>, <|start_header_id|> or [INST] (known: ChatML, Llama 3, "
                           "Llama 2, Mistral)");
    free(d);
    d = model_folder(json_pack("{s:s}", "chat_template",
                               "{{ '<|im_start|>' + m.role + '<|im_sep|>' + m.content }}"));
    expect_unrenderable(d, "separates role and content with <|im_sep|>");
    free(d);
    d = model_folder(json_pack("{s:s}", "chat_template",
                               "[SYSTEM_PROMPT]{{ s }}[/SYSTEM_PROMPT][INST]{{ u }}[/INST]"));
    expect_unrenderable(d, "has Mistral's [SYSTEM_PROMPT] form");
    free(d);

    /* no folder, and files that are there and malformed */
    wl_chat *none = (wl_chat *)&folders;
    assert_int_equal(wl_chat_load(&none, "/nonexistent/model"), -1);
    assert_null(none);
    assert_non_null(strstr(wl_error(), "/nonexistent/model: No such file or directory"));
    d = path_in(dir, "a-file");
    assert_int_equal(write_bytes(d, "x", 1), 0);
    assert_int_equal(wl_chat_load(&none, d), -1);
    assert_non_null(strstr(wl_error(), "a-file: not a folder"));
    free(d);
    d = model_folder(NULL);
    char *p = path_in(d, "tokenizer_config.json");
    assert_int_equal(write_bytes(p, "{\"chat_template\": ", 18), 0);
    wl_chat *c = (wl_chat *)&folders;
    assert_int_equal(wl_chat_load(&c, d), -1);
    assert_null(c);
    printf("  -> %s\n", wl_error());
    assert_non_null(strstr(wl_error(), p));
    assert_int_equal(write_bytes(p, "[1]", 3), 0);
    assert_int_equal(wl_chat_load(&c, d), -1);
    assert_non_null(strstr(wl_error(), "tokenizer_config.json: not a JSON object"));
    assert_int_equal(write_bytes(p, "{}", 2), 0);
    char *j = path_in(d, "chat_template.jinja");
    assert_int_equal(mkdir(j, 0777), 0); /* there, and no file to read */
    assert_int_equal(wl_chat_load(&c, d), -1);
    printf("  -> %s\n", wl_error());
    assert_non_null(strstr(wl_error(), "chat_template.jinja: cannot read it"));
    free(j);
    free(p);
    free(d);
    expect_load_error(json_pack("{s:i}", "chat_template", 3),
                      "chat_template is not a string or a list of named templates");
    expect_load_error(json_pack("{s:[{s:s}]}", "chat_template", "name", "default"),
                      "chat_template[0] is not an object with string \"name\" and \"template\"");
    expect_load_error(json_pack("{s:s, s:i}", "chat_template", chatml, "bos_token", 1),
                      "bos_token is not a string or an object with a string \"content\"");
    expect_load_error(
        json_pack("{s:s, s:{s:i}}", "chat_template", chatml, "eos_token", "content", 2),
        "eos_token is not a string or an object with a string \"content\"");
}

/* ---- the random model's ChatML ------------------------------------------------- */

static int count_of(const int32_t *ids, size_t n, int32_t id)
{
    int k = 0;
    for (size_t i = 0; i < n; i++)
        k += ids[i] == id;
    return k;
}

static void test_random_model_chat_prompt(void **state)
{
    (void)state;
    char *d = path_in(dir, "tiny");
    wl_write_opts o = {.preset = "tiny", .seed = 3, .config_only = 1};
    if (wl_write_random_model(d, &o))
        fail_msg("%s", wl_error());
    wl_chat *c = load_ok(d);
    assert_string_equal(wl_chat_family(c), "ChatML");
    char *text = render_ok(c,
                           "[{'role': 'system', 'content': 'Be brief.'}, {'role': 'user', "
                           "'content': 'The old woman'}, {'role': 'assistant', 'content': "
                           "'read.'}, {'role': 'user', 'content': 'And then?'}]",
                           1, 1);
    printf("  %s", text);
    assert_string_equal(text, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nThe old "
                              "woman<|im_end|>\n<|im_start|>assistant\nread.<|im_end|>\n"
                              "<|im_start|>user\nAnd then?<|im_end|>\n<|im_start|>assistant\n");
    char *tp = path_in(d, "tokenizer.json");
    wl_tokenizer *tk;
    if (wl_tokenizer_load(&tk, tp))
        fail_msg("%s", wl_error());
    assert_int_equal(wl_tokenizer_size(tk), TINY_VOCAB);
    int32_t *ids;
    size_t n;
    assert_int_equal(wl_encode(tk, text, strlen(text), 1, &ids, &n), 0);
    assert_int_equal(ids[0], 256); /* the tokenizer's BOS, as add_special said */
    assert_int_equal(count_of(ids, n, 256), 1);
    assert_int_equal(count_of(ids, n, 512), 5); /* <|im_start|>: four turns and the prompt */
    assert_int_equal(count_of(ids, n, 513), 4); /* <|im_end|> */
    /* every other id is a byte or a merge, and the text comes back */
    char *back = malloc(strlen(text) + 64);
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        assert_true(ids[i] >= 0 && ids[i] < TINY_VOCAB);
        int r = wl_decode_token(tk, ids[i], 1, at == 0, back + at, 64);
        assert_true(r >= 0);
        at += (size_t)r;
    }
    back[at] = 0;
    assert_string_equal(back + strlen("<|begin_of_text|>"), text);
    free(back);
    free(ids);
    /* the end of a turn is one token, and an EOS of the model */
    const char *end = wl_chat_end_of_turn(c);
    assert_int_equal(wl_encode(tk, end, strlen(end), 0, &ids, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(ids[0], 513);
    free(ids);
    wl_config cfg;
    char *cp = path_in(d, "config.json");
    assert_int_equal(wl_config_load(&cfg, cp), 0);
    assert_int_equal(cfg.vocab, TINY_VOCAB);
    assert_int_equal(cfg.n_eos, 2);
    assert_int_equal(cfg.eos_ids[0], 257);
    assert_int_equal(cfg.eos_ids[1], 513);
    /* the chat markers, last in the vocabulary, moved no other id: these
     * are the ids of the tokenizer written before they were added */
    static const struct {
        const char *text;
        int32_t ids[32];
        size_t n;
    } pinned[] = {
        {"The old woman", {256, 296, 267, 323, 264, 391, 305}, 7},
        {"the model reads the text and the tokens",
         {256, 116, 259, 372, 370, 115, 260, 400, 399, 268, 260, 316},
         12},
        {"hi<|end_of_text|>", {256, 104, 105, 257}, 4},
    };
    for (size_t k = 0; k < sizeof pinned / sizeof *pinned; k++) {
        assert_int_equal(wl_encode(tk, pinned[k].text, strlen(pinned[k].text), 1, &ids, &n), 0);
        assert_int_equal(n, pinned[k].n);
        assert_memory_equal(ids, pinned[k].ids, n * sizeof *ids);
        free(ids);
    }
    free(cp);
    free(text);
    free(tp);
    wl_tokenizer_free(tk);
    wl_chat_free(c);
    free(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_families_render_as_jinja_does),
        cmocka_unit_test(test_llama3_header_with_todays_date),
        cmocka_unit_test(test_where_the_template_comes_from),
        cmocka_unit_test(test_messages_refused_by_their_message),
        cmocka_unit_test(test_templates_refused_by_their_message),
        cmocka_unit_test(test_random_model_chat_prompt),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
