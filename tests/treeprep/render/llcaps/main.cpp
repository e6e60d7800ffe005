// llcaps: print llama.cpp's jinja::caps_get() map for a chat template file.
// Parses the template exactly like common_chat_template's constructor (common/chat.h):
//   jinja::lexer lexer; auto res = lexer.tokenize(src); prog = jinja::parse_from_tokens(res); caps = jinja::caps_get(prog);
// Optional flag --init-patches additionally applies the two source patches that
// common_chat_templates_init() (common/chat.cpp) applies before constructing the template.
#include "jinja/lexer.h"
#include "jinja/parser.h"
#include "jinja/runtime.h"
#include "jinja/caps.h"

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

// shim: common/json.cpp maps JSON_ASSERT to GGML_ASSERT -> ggml_abort (normally in ggml-base)
extern "C" void ggml_abort(const char * file, int line, const char * fmt, ...) {
    fprintf(stderr, "%s:%d: ", file, line);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    abort();
}

static void replace_all(std::string & s, const std::string & search, const std::string & repl) {
    if (search.empty()) return;
    std::string out;
    size_t pos = 0, last = 0;
    while ((pos = s.find(search, last)) != std::string::npos) {
        out.append(s, last, pos - last);
        out += repl;
        last = pos + search.size();
    }
    out.append(s, last, std::string::npos);
    s = std::move(out);
}

int main(int argc, char ** argv) {
    bool init_patches = false;
    bool debug = false;
    const char * path = nullptr;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        if (a == "--init-patches") init_patches = true;
        else if (a == "--debug") debug = true;
        else path = argv[i];
    }
    if (!path) {
        fprintf(stderr, "usage: %s [--init-patches] [--debug] TEMPLATE_FILE\n", argv[0]);
        return 2;
    }
    std::ifstream f(path, std::ios::binary);
    if (!f) { fprintf(stderr, "cannot open %s\n", path); return 2; }
    std::stringstream ss; ss << f.rdbuf();
    std::string src = ss.str();

    if (init_patches) {
        if (src.find("<|channel|>") != std::string::npos && src.find("in message.content or") != std::string::npos) {
            replace_all(src,
                "{%- if \"<|channel|>analysis<|message|>\" in message.content or "
                "\"<|channel|>final<|message|>\" in message.content %}",
                "{%- if false %}");
        }
        if (src.find("[TOOL_CALLS]") != std::string::npos && src.find("if (message['content'] is none or") != std::string::npos) {
            replace_all(src,
                "{%- if (message['content'] is none or message['content'] == '' or "
                "message['content']|length == 0) and (message['tool_calls'] is not defined or "
                "message['tool_calls'] is none or message['tool_calls']|length == 0) %}",
                "{%- if false %}");
        }
    }

    if (debug) jinja::enable_debug(true);

    try {
        jinja::lexer lexer;
        auto lexer_res = lexer.tokenize(src);
        jinja::program prog = jinja::parse_from_tokens(lexer_res);
        jinja::caps c = jinja::caps_get(prog);
        auto m = c.to_map();  // std::map -> keys sorted
        std::string out = "{";
        bool first = true;
        for (const auto & [k, v] : m) {
            if (!first) out += ", ";
            first = false;
            out += "\"" + k + "\": " + (v ? "true" : "false");
        }
        out += "}";
        fflush(stdout);
        std::cout << out << std::endl;
    } catch (const std::exception & e) {
        fflush(stdout);
        fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}
