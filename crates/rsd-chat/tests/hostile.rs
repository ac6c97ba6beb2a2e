//! Chat templates written by strangers: a template that would build terabytes or run for hours
//! gets a clear error naming the template file and the limit it hit, quickly and within a
//! memory limit, never an aborted process. See docs/UNTRUSTED.md.
//!
//! Each hostile template is rendered in a child process (this test binary, running
//! [`child_render`]) under a 2 GB address-space limit, so that an allocation the template asks
//! for shows as a failed test, not as the test run dying.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rsd_chat::{ChatTemplate, Message};

const TEMPLATE_VAR: &str = "RSD_CHAT_HOSTILE_TEMPLATE";

/// How long one hostile render may take before it counts as a hang. A hang guard only, what
/// bounds a render is its fuel, which the error names: the slowest template here (a 100M-item
/// list joined into a string) takes ~8 s in a debug build on an idle 2-core machine and ~27 s
/// with both cores busy (past the 20 s this was), so 300 s is a 10x margin.
const HANG_S: u64 = 300;

/// The child's side: renders the template in `RSD_CHAT_HOSTILE_TEMPLATE` (a no-op in a normal
/// run) and prints `OK <len>` or `ERR <message>`.
#[test]
fn child_render() {
    let Ok(src) = std::env::var(TEMPLATE_VAR) else {
        return;
    };
    let t = ChatTemplate::new(&src, "hostile.jinja", None).unwrap();
    match t.render_user("hi") {
        Ok(s) => println!("RESULT OK {}", s.len()),
        Err(e) => println!("RESULT ERR {e}"),
    }
}

/// Renders `src` in a child process under a memory limit; the error it answers with, failing
/// the test if it renders, aborts, or takes more than `secs`.
fn refused(src: &str, secs: u64) -> String {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = if std::path::Path::new("/usr/bin/prlimit").exists() {
        let mut c = Command::new("/usr/bin/prlimit");
        c.arg("--as=2000000000").arg(&exe);
        c
    } else {
        Command::new(&exe)
    };
    let started = Instant::now();
    let mut child = cmd
        .args(["--exact", "child_render", "--nocapture", "--test-threads=1"])
        .env(TEMPLATE_VAR, src)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if started.elapsed() > Duration::from_secs(secs) {
            child.kill().ok();
            panic!("no answer in {secs} s (a hang): {src}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // libtest prints the test's name on the same line.
    let Some(line) = stdout
        .lines()
        .find_map(|l| l.find("RESULT ").map(|at| &l[at + "RESULT ".len()..]))
    else {
        panic!("the rendering died ({:?}): {src}\n{stderr}", out.status);
    };
    match line.strip_prefix("ERR ") {
        Some(e) => {
            assert!(e.starts_with("chat template hostile.jinja:"), "{e}");
            e.to_string()
        }
        None => panic!("rendered ({line}) instead of refusing: {src}"),
    }
}

const OUT_OF_FUEL: &str = "template steps";

#[test]
fn str_format_widths_and_repeated_fields_are_refused_before_they_are_allocated() {
    for src in [
        "{{ '{:>100000000000}'.format('x') }}",
        "{{ '{:.100000000000f}'.format(1.5) }}",
        "{{ '{:0>100000000000}'.format(1) }}",
    ] {
        let e = refused(src, HANG_S);
        assert!(
            e.contains("str.format: a width or precision of 100000000000 is more than 65536"),
            "{e}"
        );
    }
    // One argument repeated by every field: 6.5 GB from a 100 KB argument.
    let e = refused("{{ ('{0}' * 100000).format('x' * 100000) }}", HANG_S);
    assert!(e.contains(OUT_OF_FUEL), "{e}");
    // The printf-style filter was bounded already, and stays so.
    let e = refused("{{ '%100000000000s'|format('x') }}", HANG_S);
    assert!(e.contains(OUT_OF_FUEL), "{e}");
}

/// A list (or string, or tuple) doubled again and again: 2^60 items in 60 steps.
#[test]
fn doubling_a_list_stops_with_an_error_not_a_hang() {
    let doubled = |init: &str, step: &str| {
        format!(
            "{{% set ns = namespace(l={init}) %}}{{% for i in range(60) %}}{{% set ns.l = {step} %}}\
             {{% endfor %}}{{{{ ns.l|length }}}}"
        )
    };
    for (src, expected) in [
        (doubled("[1]", "ns.l + ns.l"), "a list of"),
        (doubled("[1]", "ns.l|chain(ns.l)"), "a list of"),
        (doubled("[1]", "[ns.l, ns.l]|sum(start=[])"), "a list of"),
        (doubled("(1,)", "ns.l + ns.l"), OUT_OF_FUEL),
        (doubled("'ab'", "ns.l ~ ns.l"), OUT_OF_FUEL),
        (doubled("'ab'", "ns.l + ns.l"), OUT_OF_FUEL),
        (doubled("'ab'", "'{0}{0}'.format(ns.l)"), OUT_OF_FUEL),
        (doubled("'ab'", "ns.l.join([ns.l, ns.l])"), OUT_OF_FUEL),
        (doubled("'ab'", "[ns.l, ns.l]|join"), OUT_OF_FUEL),
        (
            "{% macro f(l, n) %}{% if n > 0 %}{{ f(l + l, n - 1) }}{% else %}{{ l|length }}\
             {% endif %}{% endmacro %}{{ f([1], 60) }}"
                .to_string(),
            "a list of",
        ),
    ] {
        let e = refused(&src, HANG_S);
        if expected == "a list of" {
            // The cap on one list or the fuel (each concatenation pays for its items),
            // whichever comes first; both say so.
            assert!(
                e.contains("more than 1048576, the most a chat template may build")
                    || e.contains(OUT_OF_FUEL),
                "{src}: {e}"
            );
        } else {
            assert!(e.contains(expected), "{src}: {e}");
        }
    }
}

/// Lazy lists of 10^8 (repetition) or 2^30 (doubling) items turned into text, which minijinja
/// writes out before it charges for them.
#[test]
fn huge_lazy_lists_are_not_turned_into_text() {
    for value in ["(['x'] * 100000000)", "((range(100000)|list) * 1000)"] {
        for use_ in [
            "{% set s %}{{ V }}{% endset %}{{ s|length }}",
            "{{ (V ~ '')|length }}",
            "{{ V|string|length }}",
            "{{ V|tojson|length }}",
            "{{ V|pprint|length }}",
            "{{ ','.join(V)|length }}",
            "{{ '{}'.format(V)|length }}",
            "{{ [1]|tojson(indent=100000000) }}",
        ] {
            let src = use_.replace('V', value);
            let e = refused(&src, HANG_S);
            assert!(
                e.contains(OUT_OF_FUEL) || e.contains("an indent of 100000000"),
                "{src}: {e}"
            );
        }
    }
}

/// A list wrapped in a list 100,000 times: minijinja prints, compares and frees such a value
/// by recursion, and it overflowed the stack (even unprinted, when it was freed).
#[test]
fn deeply_nested_values_are_refused_before_they_overflow_the_stack() {
    let nested = |step: &str, end: &str| {
        format!(
            "{{% set ns = namespace(l=[]) %}}{{% for i in range(100000) %}}{{% set ns.l = {step} \
             %}}{{% endfor %}}{end}"
        )
    };
    for src in [
        nested("[ns.l]", "x"),
        nested("[ns.l]", "{{ ns.l }}"),
        nested("{'a': ns.l}", "x"),
        nested("(ns.l,)", "x"),
        nested("dict(a=ns.l)", "x"),
        nested("namespace(a=ns.l)", "x"),
        nested("ns.l|batch(1)|list", "x"),
        nested("{'a': 1}|items|list + [ns.l]", "x"),
    ] {
        let e = refused(&src, HANG_S);
        assert!(
            e.contains(
                "lists and maps nested more than 256 deep (or a namespace that holds itself)"
            ) || e.contains(OUT_OF_FUEL),
            "{src}: {e}"
        );
    }
    // A namespace that holds itself, turned into text.
    let cycle = "{% set ns = namespace() %}{% set ns.me = ns %}";
    for end in [
        "{{ ns }}",
        "{{ ns|lower }}",
        "{{ ns|join }}",
        "{{ ns|tojson }}",
        "{{ '%s'|format(ns) }}",
        "{{ ns ~ '' }}",
    ] {
        let src = format!("{cycle}{end}");
        let e = refused(&src, HANG_S);
        assert!(
            e.contains(
                "a value nested more than 256 lists or maps deep cannot be turned into text"
            ),
            "{src}: {e}"
        );
    }
    // Compared, sorted, or dumped by debug().
    let other = "{% set o = namespace() %}{% set o.me = o %}";
    for end in [
        "{{ ns == o }}",
        "{{ ns != o }}",
        "{{ ns in [o] }}",
        "{{ [ns]|sort }}",
        "{{ ns is eq(o) }}",
        "{{ ns.values()|select('==', o)|list }}",
        "{{ debug() }}",
    ] {
        let src = format!("{cycle}{other}{end}");
        let e = refused(&src, HANG_S);
        assert!(
            e.contains("(or a namespace that holds itself)")
                || e.contains("debug() is not available in chat templates"),
            "{src}: {e}"
        );
    }
}

/// A chained comparison (`a == b == a`, `a < b < a`) of two namespaces that each hold themselves:
/// minijinja compiled its links into an instruction that compared them by recursion until the
/// stack overflowed; each link now checks its operands as `==` does.
#[test]
fn chained_comparisons_of_values_that_hold_themselves_are_refused() {
    let cycles = "{% set a = namespace() %}{% set a.x = a %}{% set b = namespace() %}\
                  {% set b.x = b %}";
    for end in [
        "{{ a == b == a }}",
        "{{ a < b < a }}",
        "{{ 1 < 2 < 3 < a < b }}",
        "{{ 1 == 1 != a != b }}",
        "{{ a >= b > 0 }}",
        "{{ a in [b] in [[b]] }}",
        "{{ a not in [b] not in [a] }}",
        "{% if 0 < 1 and a <= b <= a %}x{% endif %}",
        "{% for i in [1] %}{{ i < a < b }}{% endfor %}",
        "{% macro f(x, y) %}{{ x == y == x }}{% endmacro %}{{ f(a, b) }}",
        "{{ [a]|select('ne', 1)|map('ne', 1)|list }}{{ a != b != a }}",
    ] {
        let src = format!("{cycles}{end}");
        let e = refused(&src, HANG_S);
        assert!(
            e.contains(
                "lists and maps nested more than 256 deep (or a namespace that holds itself)"
            ),
            "{src}: {e}"
        );
    }
    // The error names the construct and the line of the comparison.
    let e = refused(&format!("{cycles}\n\n{{{{ 1 < a < b }}}}"), HANG_S);
    assert!(
        e.contains("a chained comparison: lists and maps nested"),
        "{e}"
    );
    assert!(e.contains("(line 3)"), "{e}");
}

#[test]
fn splitting_is_paid_for_before_the_pieces_exist() {
    let e = refused("{{ ('abc' * 10000000).split('')|length }}", HANG_S);
    assert!(e.contains("split: empty separator"), "{e}");
    let e = refused("{{ ('abc' * 10000000)|split('')|length }}", HANG_S);
    assert!(e.contains("split: empty separator"), "{e}");
    for src in [
        "{{ ('a b ' * 10000000).split()|length }}",
        "{{ ('a,' * 30000000).split(',')|length }}",
        "{{ ('a\n' * 30000000).splitlines()|length }}",
        "{{ ('a\n' * 30000000)|lines|length }}",
    ] {
        let e = refused(src, HANG_S);
        assert!(e.contains(OUT_OF_FUEL), "{src}: {e}");
    }
}

/// Filters, methods and functions whose result can be far larger than their input, or that
/// walk a list without paying for it: each checks the size first (or caps its argument),
/// positionally and by keyword, and answers with the filter and the bound. Without the checks
/// these aborted the process (`memory allocation of 100000000000 bytes failed`) or ran for
/// minutes.
#[test]
fn filters_that_could_build_far_more_than_their_input_check_the_size_first() {
    let wide = "indent: a width of 100000000000 is more than 65536";
    for (src, expected) in [
        ("{{ ('x\n' * 100)|indent(100000000000) }}", wide),
        ("{{ ('x\n' * 100)|indent(width=100000000000) }}", wide),
        ("{{ ('x\n' * 100)|indent(100000000000, true, true) }}", wide),
        (
            "{{ ('x\n' * 100)|indent(width=100000000000, first=true, blank=true) }}",
            wide,
        ),
        ("{{ ['x\n', 'y']|map('indent', 100000000000)|list }}", wide),
        (
            "{{ ('x\n' * 100000)|indent(60000)|length }}",
            "indent: the result could take",
        ),
        (
            "{{ ('x\n' * 100000)|indent(60000, true)|length }}",
            "indent: the result could take",
        ),
        (
            "{{ ('\n' * 100000)|indent(width=60000, first=true, blank=true)|length }}",
            "indent: the result could take",
        ),
        (
            "{{ [1]|tojson(indent=100000000000) }}",
            "tojson: an indent of 100000000000 is more than 65536",
        ),
        (
            "{{ [1]|tojson(100000000000) }}",
            "tojson: an indent of 100000000000 is more than 65536",
        ),
        (
            "{{ (range(5000)|list)|tojson(indent=60000)|length }}",
            "tojson: the result could take",
        ),
        (
            "{{ ((range(100)|list) * 1000000)|groupby('x')|length }}",
            "groupby: a list of more than 1048576 items",
        ),
        (
            "{{ (['x'] * 100000000)|groupby(attribute='x')|length }}",
            "groupby: a list of more than 1048576 items",
        ),
        ("{{ raise_exception(['x'] * 100000000) }}", OUT_OF_FUEL),
        ("{{ strftime_now(['x'] * 100000000) }}", OUT_OF_FUEL),
        (
            "{{ strftime_now('%+' * 30000000)|length }}",
            "strftime_now: the result could take",
        ),
        (
            "{{ 'x'.startswith(['y'] * 100000000) }}",
            "str.startswith: a list of more than 1048576 items",
        ),
        (
            "{% set l = range(100000)|list %}{% for i in range(100000) %}{{ l.count(1) }}\
             {% endfor %}",
            OUT_OF_FUEL,
        ),
        (
            "{% set l = (range(100000)|map('string')|list) %}{% for i in range(100000) %}\
             {{ 'x'.endswith(l) }}{% endfor %}",
            OUT_OF_FUEL,
        ),
        (
            "{{ ('a' * 1000000)|replace('a', 'b' * 1000, 100000)|length }}",
            "replace: the result could take",
        ),
        (
            "{{ ('a' * 1000000)|replace('a', 'b' * 1000, count=-1)|length }}",
            "replace: the result could take",
        ),
    ] {
        let e = refused(src, HANG_S);
        assert!(e.contains(expected), "{src}: {e}");
        if expected != OUT_OF_FUEL && expected.contains("could take") {
            // A bound that is the fuel says so, as every other one does.
            assert!(e.contains(OUT_OF_FUEL), "{src}: {e}");
        }
    }
}

/// Filters and methods a template may try that rsd's minijinja does not have: an error, not
/// a rendering (minijinja-contrib's `wordwrap`, `center` and the like are not installed, and
/// Python's `str.center`, `ljust`, `rjust`, `zfill` are not among pycompat's methods).
#[test]
fn filters_and_methods_that_are_not_installed_are_unknown() {
    for src in [
        "{{ 'x'|center(100000000000) }}",
        "{{ 'x'|wordwrap(100000000000) }}",
        "{{ 'x'|truncate(3) }}",
        "{{ 'x'|urlencode }}",
        "{{ 'x'|striptags }}",
        "{{ 'x'|filesizeformat }}",
        "{{ 'x'.center(100000000000) }}",
        "{{ 'x'.ljust(100000000000) }}",
        "{{ 'x'.rjust(100000000000) }}",
        "{{ 'x'.zfill(100000000000) }}",
        "{{ 'x\ty'.expandtabs(100000000000) }}",
        "{{ lipsum(100000000000) }}",
        "{{ cycler(1, 2).next() }}",
    ] {
        let e = ChatTemplate::new(src, "t.jinja", None)
            .map_err(|e| e.to_string())
            .and_then(|t| t.render_user("hi").map_err(|e| e.to_string()))
            .unwrap_err();
        assert!(
            e.contains("unknown filter")
                || e.contains("unknown method")
                || e.contains("unknown function")
                || e.contains("cannot call"),
            "{src}: {e}"
        );
    }
}

#[test]
fn the_out_of_fuel_error_says_what_the_budget_pays_for() {
    let e = refused("{{ 'x' * 100000000 }}", HANG_S);
    assert!(
        e.contains("rendering stopped after 1000000 template steps (one per instruction and per 64 bytes of data"),
        "{e}"
    );
}

fn user(content: &str) -> Message {
    Message {
        role: "user".into(),
        content: content.into(),
    }
}

/// minijinja as it is, set up as rsd-chat sets it up but without the bounds.
fn stock(src: &str) -> Result<String, String> {
    let mut env = minijinja::Environment::new();
    let syntax = minijinja::syntax::SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .build()
        .unwrap();
    env.set_syntax(syntax);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    let ctx = minijinja::context! {
        messages => vec![minijinja::context!{role => "user", content => "hi"}],
        add_generation_prompt => true,
    };
    env.render_str(src, ctx).map_err(|e| e.to_string())
}

/// What the bounded `+`, `~` and wrapped filters and methods compute is what minijinja's own
/// compute.
#[test]
fn honest_templates_render_as_stock_minijinja_renders_them() {
    let cases = [
        "{{ 1 + 2 }} {{ 1 + 2.5 }} {{ 2**70 + 1 }} {{ true + 1 }} {{ 2**62 + 2**62 }}",
        "{{ 'a' + 'b' }} {{ 'a' ~ 1 ~ none }} {{ x ~ 'y' }} {{ [1] ~ {'a': 'b'} }}",
        "{{ [1, 2] + [3] }} {{ (1, 2) + (3,) }} {{ ('a'|safe) + ('b'|safe) }}",
        "{{ ([1] + [2]) + ([3] + [4]) }} {{ ([1] + [2])|length }} {{ (range(3) + [1])|list }}",
        "{{ [[1], [2]]|sum(start=[]) }} {{ [1, 2, 3]|sum }} {{ [{'a': 1}]|sum(attribute='a') }}",
        "{{ [1]|chain([2], [3])|list }} {{ {'a': 1}|chain({'b': 2})|list }}",
        "{{ {'a': [1, 'b']}|tojson }} {{ [1]|tojson(indent=2) }} {{ [1]|string }} {{ [1]|pprint }}",
        "{{ '{:>4}|{:.2f}|{{'.format('a', 1.5) }} {{ '{0}{1}{0}'.format('a', 2) }} {{ ', '.join(['a', 'b']) }}",
        "{{ 'a</think>b'.split('</think>')[-1] }} {{ 'a b'|split|list }} {{ 'a\nb'|lines }}",
        "{{ 'a b'.split() }} {{ 'a\nb\n'.splitlines() }} {{ 'a,b'.split(',', 1) }}",
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] }}{% endfor %}",
        "{% macro f(x) %}{{ x + 1 }}{% endmacro %}{{ f(1) }}{% set l = [1] + [2] %}{{ l }}",
        "{{ {'b': 1, 'a': 2}|items|list }} {{ {'b': 1, 'a': 2}|dictsort }} {{ {'a': 1}.items()|list }}",
        "{{ [1, 2, 3]|batch(2)|list }} {{ [1, 2, 3]|slice(2)|list }} {{ [1, 2]|zip([3, 4])|list }}",
        "{{ [{'k': 1}]|groupby('k')|list }} {{ dict(a=1, b=[2]) }} {{ dict({'c': 3}, a=1) }}",
        "{{ namespace(a=1).a }} {% set ns = namespace(x=[1]) %}{% set ns.x = ns.x + [2] %}{{ ns.x }}",
        "{{ 'AbC'|lower }} {{ ' a '|trim }} {{ 'ab'|replace('a', 'c') }} {{ 'x\ny'|indent(2, first=true) }}",
        "{{ '%s-%d'|format('a', 3) }} {{ [1, 2]|join('-') }} {{ ['a', 'b']|join }} {{ 'a'|upper|e }}",
        "{{ 1 == 1.0 }} {{ 'a' < 'b' }} {{ [1] == [1] }} {{ 'a' in 'cat' }} {{ 1 in [1] }} {{ 'k' in {'k': 1} }} {{ 1 != 2 }} {{ 2 >= 1 }} {{ none == none }} {{ x == none }} {{ 1 < 2 < 3 }} {{ 3 not in [1] }} {{ {'a': 1} == {'a': 1} }}",
        "{{ 1 is eq(1) }} {{ 2 is gt(1) }} {{ 1 is in([1]) }} {{ [1, 2, 3]|select('>', 1)|list }} {{ [1, 2]|reject('==', 1)|list }} {{ {'a': 1}.values() }}",
        "{{ [1, (2, 3), {'a': [4]}] }} {{ {'b': 1, 'a': 2} }} {{ () }} {{ [] }} {{ {} }} {{ [1][0] }}",
        // Chained comparisons, true, false at the first link and false at a later one (of
        // variables: minijinja folds comparisons of constants when it compiles them).
        "{% for x in [0, 1, 2, 3, 5] %}{{ 1 < x < 3 }} {{ 1 <= x <= 3 }} {{ 5 > x >= 1 }} {{ x < 3 < 4 }} {{ 0 < 1 < x }} {% endfor %}",
        "{% set a, b, n, f, t = 'a', 'b', 1, 1.0, true %}{{ a == a == a }} {{ a == a == b }} {{ b == a == a }} {{ n == f == n }} {{ n != 2 != n }} {{ n == n == t }} {{ a != b != a != b }}",
        "{% set n, s = 1, 'a' %}{{ n < 2 < 3 < 4 < 5 }} {{ n < 2 < 3 < 2 < 5 }} {{ n < s < 2 }} {{ x == none == none }} {{ x == y == z }} {{ x != n != x }}",
        "{% set s, n, l = 'a', 1, [1] %}{{ s in 'abc' in ['abc'] }} {{ n in l in [l] }} {{ 2 not in l not in [[2]] }} {{ n in l not in [2] }} {{ 'q' in s in 'x' }} {{ s not in 'b' in 'ab' }}",
        "{% set l, m, t = [1], {'a': [1]}, (1, 2) %}{{ l == [1] == l }} {{ m == {'a': [1]} != {'b': 2} }} {{ t < (1, 3) < (2,) }} {{ [1, 2] < l + [3] <= [1, 3] }} {{ m != l != m }}",
        "{% set a = 'x' %}{% set b = 'x' %}{% set c = 'y' %}{% if a == b == c %}1{% elif a == b != c %}2{% endif %}{{ (a == b == a) ~ (a < c < 'z') }}",
        "{% macro f(x) %}{{ 0 < x < 10 }}{% if -1 < x < 1 %}z{% endif %}{% endmacro %}{{ f(0) }}{{ f(5) }}{{ f(50) }}",
        "{% for m in messages %}{% if 0 <= loop.index0 < 1 < 2 and m.role == 'user' == m['role'] %}{{ m.content }}{% endif %}{% endfor %}",
        "{% set n = 2 %}{{ [1, 2, 3]|select('>', 1)|list == [2, 3] == [n, 3] }} {{ not 1 < n < 3 }} {{ (1 < n < 3) + 1 }} {{ [1 < n < 0, 3 > n > 1] }}",
        "{% set n = 2 %}{{ 1 < n < 3 if n > 1 > 0 else 0 > n > 2 }} {{ 'a' ~ (1 < n < 3) ~ 'b' }} {{ [1, 2][0 < n < 3] }} {{ (n < 3 < 4) is true }}",
        "{% set ns = namespace(l=[1]) %}{{ ns.l == [1] == ns.l }} {{ ns == ns == ns }} {{ ns.l != ns.l == [1] }}",
        // The filters checked for the size of what they build, with every way of passing
        // their arguments.
        "{{ 'a\nb\n\nc\n'|indent }}|{{ 'a\nb'|indent(2) }}|{{ 'a\n\nb'|indent(2, true, true) }}|{{ 'a\nb'|indent(width=3, first=true) }}|{{ 'a\n\nb'|indent(2, blank=true) }}|{{ 'a\r\n\r\nb'|indent(1, true, true) }}|{{ 'a\nb'|indent(none, first=true) }}|{{ ''|indent(8, true) }}|{{ [1, 2]|indent(2, true) }}",
        "{{ {'a': '<b>'}|tojson|indent(4, first=true) }}|{{ ['x\n', 'y']|map('indent', 2, true)|list }}",
        "{{ 'aaa'|replace('a', 'b', 2) }} {{ 'aaa'|replace('a', 'b', count=1) }} {{ 'aaa'|replace('a', 'bb', -1) }} {{ 'aaa'|replace('a', 'b') }} {{ 'ab'|replace('', '-') }} {{ 'abab'|replace('ab', 'x', none) }} {{ 1.5|replace('.', ',') }}",
        "{% autoescape true %}{{ '<a>'|replace('a', 'b', 1) }} {{ ('<a>'|safe)|replace('a', '&') }} {{ '<a>'|replace('a'|safe, 'b') }}{% endautoescape %}",
        "{{ {'a': [1, {'b': 'c<'}]}|tojson(indent=2) }}|{{ [1]|tojson(indent=true) }}|{{ [1]|tojson(false) }}|{{ [1, [2]]|tojson(4) }}|{{ {}|tojson(indent=0) }}|{{ 'x\u{1}'|tojson }}",
        "{{ {'a': [1, 'x\u{1}'], 'b': {'c': none}}|pprint }}|{{ 'x'|pprint }}",
        "{{ 'ß'|upper }} {{ 'ǆ xΣ'|title }} {{ 'ΐ'|upper }} {{ 'aB'|capitalize }} {{ 'ÀB'|lower }} {{ '<a&\"'|e }} {{ \"'\"|e }} {{ '<'|escape }} {{ ' x '|trim }} {{ 'xax'|trim('x') }} {{ 1|safe }}",
        "{{ 'ab'.upper() }} {{ 'AB'.lower() }} {{ 'a b'.title() }} {{ 'ab'.capitalize() }} {{ 'abc'.startswith(['x', 'a']) }} {{ 'abc'.endswith(('c',)) }} {{ 'abc'.startswith('b') }} {{ [1, 2, 1].count(1) }} {{ 'abab'.count('a') }} {{ 'aaa'.replace('a', 'bb', 2) }}",
        "{{ [{'k': 2}, {'k': 1}]|groupby('k')|list }} {{ [{'k': 'a'}, {'k': 'A'}]|groupby(attribute='k', case_sensitive=true)|list }} {{ [{'k': 1}]|groupby('j', default=0)|list }} {% for g, l in [{'k': 1, 'v': 'x'}]|groupby('k') %}{{ g }}{{ l }}{% endfor %}",
        "{{ {'b': 1, 'a': 2}|dictsort(by='value', reverse=true) }} {{ {'b': 1, 'A': 2}|dictsort(case_sensitive=true) }} {{ {'b': 1, 'a': 2}|dictsort }}",
    ];
    for src in cases {
        let t = ChatTemplate::new(src, "honest.jinja", None).unwrap();
        let ours = t.render_user("hi").map_err(|e| e.to_string());
        assert_eq!(ours, stock(src), "{src}");
    }
    for (src, expected) in [
        (
            "{{ 'a' + 1 }}",
            "tried to use + operator on unsupported types string and number",
        ),
        (
            "{{ [1] + 1 }}",
            "tried to use + operator on unsupported types sequence and number",
        ),
        ("{{ 'ab'.split('') }}", "split: empty separator"),
    ] {
        let e = ChatTemplate::new(src, "t.jinja", None)
            .unwrap()
            .render_user("hi")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("chat template t.jinja:") && e.contains(expected),
            "{e}"
        );
    }
}

/// A long honest conversation gets fuel in proportion: a 16 MB message through a ChatML
/// template that copies it with `+` several times.
#[test]
fn long_conversations_get_fuel_in_proportion() {
    let src = "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + \
               '<|im_end|>\n' }}{% endfor %}";
    let t = ChatTemplate::new(src, "chatml.jinja", None).unwrap();
    let long = "x".repeat(16 << 20);
    let out = t.render(&[user(&long)], false).unwrap();
    assert_eq!(
        out.len(),
        long.len() + "<|im_start|>user\n<|im_end|>\n".len()
    );
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    /// Pieces of templates: values, operators, filters and methods, stuck together at random.
    fn piece() -> impl Strategy<Value = &'static str> {
        prop::sample::select(vec![
            "1",
            "2.5",
            "'ab'",
            "[1, 2]",
            "(1,)",
            "{'a': 1}",
            "none",
            "messages",
            "m",
            "messages[0].content",
            "ns.l",
            "x",
            " + ",
            " ~ ",
            " * ",
            " * 3",
            "|length",
            "|string",
            "|tojson",
            "|join(',')",
            "|list",
            "|sum",
            "|chain([1])",
            "|split",
            "|format(1)",
            ".format(1, 'a')",
            ".split('b')",
            ".join(['a', 'b'])",
            "(",
            ")",
            "[",
            "]",
            ", ",
            "{:>5}",
            "{0}",
            "{:.3f}",
            "'{:>9}'",
            "%s",
            "range(5)",
        ])
    }

    /// Small values for chained comparisons (`x` is undefined, or a loop's or macro's value).
    fn chain_operand() -> impl Strategy<Value = &'static str> {
        prop::sample::select(vec![
            "0",
            "1",
            "2",
            "2.0",
            "-1",
            "true",
            "none",
            "'a'",
            "'b'",
            "'ab'",
            "[1]",
            "[1, 2]",
            "(1,)",
            "{'a': 1}",
            "x",
            "messages[0].role",
            "range(3)",
        ])
    }

    fn chain_operator() -> impl Strategy<Value = &'static str> {
        prop::sample::select(vec!["==", "!=", "<", "<=", ">", ">=", "in", "not in"])
    }

    fn wrap(expr: &str, kind: u8) -> String {
        match kind % 4 {
            0 => format!("{{{{ {expr} }}}}"),
            1 => format!("{{% set ns = namespace(l=[1]) %}}{{% for i in range(8) %}}{{% set ns.l = {expr} %}}{{% endfor %}}{{{{ ns.l }}}}"),
            2 => format!("{{% for m in messages %}}{{{{ {expr} }}}}{{% endfor %}}"),
            _ => format!("{{% set x %}}{{{{ {expr} }}}}{{% endset %}}{{{{ x ~ x }}}}"),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Random expressions from those pieces: an error or a string, never a panic.
        #[test]
        fn random_templates_render_or_fail_cleanly(
            pieces in proptest::collection::vec(piece(), 1..8),
            kind in any::<u8>(),
            content in "[a-z {}%:.0-9]{0,20}",
        ) {
            let src = wrap(&pieces.concat(), kind);
            if let Ok(t) = ChatTemplate::new(&src, "random.jinja", None) {
                match t.render_user(&content) {
                    Ok(_) => {}
                    Err(e) => prop_assert!(e.to_string().starts_with("chat template random.jinja:")),
                }
            }
        }

        /// Every filter and method that builds text or lists from an argument, with arguments
        /// from zero to past u64 (positional and keyword) over random values, chained twice: an
        /// error or a string of bounded size, never an abort. An unbounded one (minijinja's own
        /// `indent`, say) allocates what its argument asks before anything is charged.
        #[test]
        fn bounded_filters_with_random_arguments_render_or_fail_cleanly(
            value in prop::sample::select(vec![
                "'x\\n' * 1000", "'ab'", "'Hello World'", "[1, 2, 3]", "{'b': 1, 'a': [2, 3]}",
                "messages", "range(1000)", "[{'a': 1}, {'a': 2}]", "''",
            ]),
            calls in proptest::collection::vec(prop::sample::select(vec![
                "|indent(N)", "|indent(width=N)", "|indent(N, true, true)",
                "|indent(width=N, first=true, blank=true)", "|tojson(indent=N)", "|tojson(N)",
                "|pprint", "|string", "|lower", "|upper", "|title", "|capitalize", "|escape",
                "|replace('a', 'bb' * N)", "|replace('', 'xy', N)", "|replace('x', 'y', count=N)",
                "|join('-' * N)", "|split", "|lines", "|dictsort", "|groupby('a')",
                "|batch(N)", "|slice(N)", "|list", "|sum(start=[])", "|format(N)",
                ".replace('x', 'yy' * N)", ".split('x', N)", ".splitlines()",
                "|string|count('x')", "|string|startswith(['a', 'b'])",
            ]), 1..3),
            n in prop::sample::select(vec![
                "0", "1", "7", "65536", "65537", "100000", "100000000000",
                "18446744073709551616", "-5",
            ]),
        ) {
            let expr = format!("({value}){}", calls.concat().replace('N', n));
            let src = format!("{{{{ {expr} }}}}");
            if let Ok(t) = ChatTemplate::new(&src, "bounded.jinja", None) {
                match t.render_user("hi") {
                    Ok(out) => prop_assert!(out.len() < 1 << 30, "{expr}: {} bytes", out.len()),
                    Err(e) => prop_assert!(
                        e.to_string().starts_with("chat template bounded.jinja:"),
                        "{expr}: {e}"
                    ),
                }
            }
        }

        /// Random `str.format` fields (fills, alignments, widths up to past u64, precisions,
        /// types) and arguments, among random text: an error or a string, never a panic or an
        /// allocation of the width asked.
        #[test]
        fn random_format_strings_render_or_fail_cleanly(
            junk in "[{}:<>^0-9.,_fsdxeg!r ]{0,12}",
            options in "[<>^0 ,_#+-]{0,3}",
            width in prop::sample::select(vec!["", "9", "99999", "100000000000", "18446744073709551616"]),
            precision in prop::option::of(prop::sample::select(vec![0u64, 3, 70000, 100_000_000_000])),
            ty in "[sdfxeg]?",
            arg in prop::sample::select(vec!["'x'", "1", "1.5", "[1, 2]", "none", "{'a': 1}"]),
        ) {
            let precision = precision.map_or(String::new(), |p| format!(".{p}"));
            let fmt = format!("{junk}{{:{options}{width}{precision}{ty}}}").replace('\'', "");
            let src = format!("{{{{ '{fmt}'.format({arg}, {arg}) }}}}");
            if let Ok(t) = ChatTemplate::new(&src, "format.jinja", None) {
                if let Err(e) = t.render_user("hi") {
                    prop_assert!(e.to_string().starts_with("chat template format.jinja:"));
                }
            }
        }

        /// Random chained comparisons (2 to 5 operands) of small values, in an expression, an
        /// `if`, a loop and a macro: what stock minijinja renders, or an error where it fails.
        #[test]
        fn random_chained_comparisons_render_as_stock_minijinja_renders_them(
            first in chain_operand(),
            links in proptest::collection::vec((chain_operator(), chain_operand()), 1..5),
            kind in 0u8..4,
        ) {
            let mut expr = first.to_string();
            for (op, operand) in &links {
                expr = format!("{expr} {op} {operand}");
            }
            let src = match kind {
                0 => format!("{{{{ {expr} }}}}"),
                1 => format!("{{% if {expr} %}}yes{{% else %}}no{{% endif %}}"),
                2 => format!("{{% for v in [1, 'a'] %}}{{{{ {} }}}},{{% endfor %}}", expr.replace('x', "v")),
                _ => format!("{{% macro f(v) %}}{{{{ {} }}}}{{% endmacro %}}{{{{ f(2) }}}}{{{{ f([1]) }}}}", expr.replace('x', "v")),
            };
            let ours = ChatTemplate::new(&src, "chain.jinja", None)
                .map_err(|e| e.to_string())
                .and_then(|t| t.render_user("hi").map_err(|e| e.to_string()));
            match (ours, stock(&src)) {
                (Ok(ours), Ok(stock)) => prop_assert_eq!(ours, stock, "{}", src),
                (Err(e), Err(_)) => prop_assert!(e.starts_with("chat template chain.jinja:"), "{}: {}", src, e),
                (ours, stock) => prop_assert!(false, "{}: ours {:?}, stock {:?}", src, ours, stock),
            }
        }

        /// Random bytes as a template: a compile error or a rendering, never a panic.
        #[test]
        fn random_bytes_as_a_template_fail_cleanly(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let src = String::from_utf8_lossy(&bytes);
            if let Ok(t) = ChatTemplate::new(&src, "bytes.jinja", None) {
                let _ = t.render_user("hi");
            }
        }
    }
}
