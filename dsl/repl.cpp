// `rag repl`: reading entries. A terminal gets libedit line editing, completion and history in
// ~/.rag_history; anything else (a pipe, a file) is read as plain lines with no prompt and no
// echo, so a transcript holds only the REPL's answers. An entry continues on "..." lines while
// brackets are open.
#include "dsl/repl.hpp"
#include "dsl/repl_session.hpp"

#include <editline/readline.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

namespace rag {

namespace {

repl::Session* completing = nullptr;

// Ctrl-C at the prompt drops the line being typed. The interpreter cannot be stopped inside a
// call, so during an evaluation the first Ctrl-C only says so and a second one ends rag.
volatile std::sig_atomic_t interrupted = 0;
volatile std::sig_atomic_t evaluating = 0;

void on_interrupt(int) {
    if (evaluating) {
        if (interrupted) {
            std::signal(SIGINT, SIG_DFL);
            std::raise(SIGINT);
            return;
        }
        static const char msg[] =
            "\n(rag cannot stop an evaluation midway; Ctrl-C again ends the session)\n";
        [[maybe_unused]] auto n = write(STDERR_FILENO, msg, sizeof msg - 1);
    }
    interrupted = 1;
}

char* complete_name(const char* text, int state) {
    static std::vector<std::string> words;
    static std::size_t next = 0;
    if (state == 0) {
        words = completing ? completing->completions() : std::vector<std::string>{};
        next = 0;
    }
    const std::size_t n = std::strlen(text);
    while (next < words.size()) {
        const std::string& w = words[next++];
        if (w.compare(0, n, text) == 0) return strdup(w.c_str());
    }
    return nullptr;
}

char** complete(const char* text, int start, int) {
    // After :load, complete file names (libedit's default).
    if (start > 0 && rl_line_buffer && std::strncmp(rl_line_buffer, ":load ", 6) == 0)
        return nullptr;
    rl_attempted_completion_over = 1;
    return rl_completion_matches(text, complete_name);
}

std::optional<std::string> read_plain(std::FILE* in) {
    std::string line;
    int c;
    bool any = false;
    while ((c = std::fgetc(in)) != EOF) {
        any = true;
        if (c == '\n') break;
        line += char(c);
    }
    if (!any) return std::nullopt;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    return line;
}

std::optional<std::string> read_terminal(const char* prompt) {
    char* raw = readline(prompt);
    if (!raw) return std::nullopt;
    std::string line(raw);
    std::free(raw);
    if (line.find_first_not_of(" \t") != std::string::npos) add_history(line.c_str());
    return line;
}

} // namespace

int run_repl(std::FILE* in, std::FILE* out) {
    const bool tty = in == stdin && isatty(fileno(in));
    // At a terminal errors are part of the conversation; from a pipe (a script) they go to
    // stderr and make the exit status 1, so a failing script fails.
    repl::Session session(out, tty ? out : stderr);
    std::string history;
    if (tty) {
        if (const char* home = std::getenv("HOME")) history = std::string(home) + "/.rag_history";
        rl_readline_name = "rag";
        rl_basic_word_break_characters = " \t\n\"\\'`@$><=;|&{(,[)]+-*/";
        rl_attempted_completion_function = complete;
        completing = &session;
        using_history();
        stifle_history(1000);
        if (!history.empty()) read_history(history.c_str());
        struct sigaction sa {};
        sa.sa_handler = on_interrupt;
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = 0; // no SA_RESTART: readline returns at once
        sigaction(SIGINT, &sa, nullptr);
        std::fputs("rag repl: :help lists the commands, :quit or Ctrl-D leaves\n", out);
    }
    std::string pending;
    while (!session.finished()) {
        std::fflush(out);
        auto line = tty ? read_terminal(pending.empty() ? "rag> " : "...  ") : read_plain(in);
        if (tty && interrupted) {
            interrupted = 0;
            if (!line) {
                std::fputs("^C\n", out);
                pending.clear();
                continue;
            }
        }
        if (!line) {
            if (tty && !pending.empty()) { // Ctrl-D inside an unfinished entry drops it
                std::fputs("\n(unfinished entry dropped)\n", out);
                pending.clear();
                continue;
            }
            if (!pending.empty()) session.handle(pending);
            if (tty) std::fputs("\n", out);
            break;
        }
        if (pending.empty() && line->find_first_not_of(" \t") == std::string::npos) continue;
        // A command never continues an entry: end the open one (it reports its error) first.
        if (!pending.empty() && !line->empty() && (*line)[0] == ':') {
            std::string entry;
            entry.swap(pending);
            session.handle(entry);
        }
        pending += (pending.empty() ? "" : "\n") + *line;
        if (repl::open_brackets(pending) > 0) continue;
        std::string entry;
        entry.swap(pending);
        evaluating = 1;
        session.handle(entry);
        evaluating = 0;
        interrupted = 0;
        if (tty && !history.empty()) write_history(history.c_str());
    }
    completing = nullptr;
    std::fflush(out);
    return !tty && session.had_error() ? 1 : 0;
}

} // namespace rag
