//! What a chat template may make the engine build, bounded.
//!
//! minijinja's fuel pays for instructions and for most data a template creates, but some
//! operations of minijinja 3.1 build data before (or without) paying for it, and a few bytes of
//! template can make them ask for terabytes (an aborted process) or run for hours:
//!
//! * `+` of two lists is lazy and free; chained 33 deep (a list doubled in a loop, a macro
//!   recursing on `l + l`) it is copied out whole, 2^33 items, without fuel;
//! * turning a huge lazy list into a string (`{{ l }}` inside a `{% set %}` block, `l ~ ''`)
//!   writes all of it before the fuel is charged;
//! * Python's `str.format` pads to any width (`'{:>100000000000}'.format('x')`) and repeats an
//!   argument for every field that names it;
//! * the `chain` and `sum` filters concatenate lists the way `+` does;
//! * the filter functions minijinja exports for `indent`, `groupby`, `dictsort` and `tojson`
//!   are its unfueled ones (`indent(100000000000)` asked for 100 GB; `groupby` collected a
//!   lazy list of 10^8 items), and those for `replace` lack its `count`;
//! * pycompat's `list.count` and `str.startswith`/`endswith` with a list walk it for free, and
//!   its `upper`, `lower`, `title` and `capitalize`, like the filters, may triple a string.
//!
//! The template's `+` and `~` are therefore compiled into calls of [`add`] and [`concat`]
//! (registered under names no template can spell, so none can shadow them), and `str.format`,
//! `chain` and `sum` are wrapped: each checks the size of what it is about to build against the
//! fuel left (or a stated cap) *before* building it, and answers with an error that says which
//! limit was hit. Output of containers (`{{ l }}`) goes through [`formatter`], which charges
//! for the container's size first. A result that may be far larger than its input (`indent`,
//! `tojson` and `pprint` with their indentation, case mappings, escaping, `strftime_now`) is
//! checked against the fuel left before it is built ([`ensure_bytes`]); the engine then
//! charges for what was built. Everything else minijinja already charges before it allocates
//! (string repetition is capped at 100 MB and checked against the fuel, `range` at 100,000
//! items, the printf-style `format` filter checks its widths, `join` and the list filters pay
//! per item). docs/UNTRUSTED.md has the table of every filter, test, function and method.
use minijinja::value::{Kwargs, Rest, ValueKind};
use minijinja::{Error, ErrorKind, Output, State, Value};

/// Name of the function `+` is compiled into (not an identifier: no template can call, define
/// or shadow it).
pub(crate) const ADD: &str = "rsd:+";
/// Name of the function `~` is compiled into.
pub(crate) const CONCAT: &str = "rsd:~";

/// Name of the function list literals (`[a, b]`) are compiled into.
pub(crate) const LIST: &str = "rsd:[]";
/// Name of the function tuple literals (`(a, b)`) are compiled into.
pub(crate) const TUPLE: &str = "rsd:()";
/// Name of the function map literals (`{'a': b}`) are compiled into.
pub(crate) const MAP: &str = "rsd:{}";

/// The most items one list built by `+` (or the `chain` and `sum` filters) may have. A chat
/// template concatenates lists of messages or tools: thousands of items at most.
pub(crate) const MAX_LIST_ITEMS: usize = 1 << 20;

/// The largest width or precision `str.format` may ask for. A template pads to a few columns;
/// Rust's own formatting refuses precisions above 65535.
pub(crate) const MAX_FORMAT_WIDTH: usize = 1 << 16;

/// The deepest nesting of lists and maps a value may have to be turned into text: deeper
/// values (a list wrapped in a list 100,000 times) would overflow the stack when printed.
pub(crate) const MAX_NESTING: usize = 256;

/// Fuel per this many bytes of data (minijinja charges one fuel per 64 bytes).
const BYTES_PER_FUEL: u64 = 64;

/// Fuel per this many bytes of a container turned into text (minijinja charges 16 times a
/// plain byte for it: walking a value is slower than copying bytes).
const SERIALIZED_BYTES_PER_FUEL: u64 = 4;

fn invalid(message: String) -> Error {
    Error::new(ErrorKind::InvalidOperation, message)
}

/// Pays for `bytes` of data about to be created; fails (out of fuel) before it is.
fn pay_bytes(state: &State, bytes: u64, per_fuel: u64) -> Result<(), Error> {
    state.consume_fuel(bytes / per_fuel)
}

/// What turning a value into text may write, measured before it is written.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct TextSize {
    /// An upper bound on the bytes of the text on one line (see [`pay_for_text`]).
    pub(crate) bytes: u64,
    /// The lines a pretty-printed form may take (one per value, one more per list or map).
    pub(crate) lines: u64,
    /// The indentation levels of those lines, summed: a pretty-printed form indents a value
    /// nested `d` deep by `d` levels, so its indentation is this times the width of a level.
    pub(crate) levels: u64,
}

impl TextSize {
    /// The bytes of a pretty-printed form indented `width` bytes a level, each value's text
    /// escaped to at most `escape` times its length (JSON's `\u0001` is 6 bytes for 1).
    pub(crate) fn pretty(&self, width: u64, escape: u64) -> u64 {
        self.bytes
            .saturating_mul(escape)
            .saturating_add(self.levels.saturating_mul(width))
            .saturating_add(self.lines.saturating_mul(2))
    }
}

/// An upper bound on the bytes `value` takes as text, paid for as it is measured: strings by
/// their length, numbers and other scalars a few bytes, lists and maps their items (walked
/// without recursion, to a depth of [`MAX_NESTING`]) plus separators. A huge lazy list runs out
/// of fuel while it is measured, before any of its text exists.
pub(crate) fn pay_for_text(state: &State, value: &Value) -> Result<u64, Error> {
    measure_text(state, value).map(|m| m.bytes)
}

/// [`pay_for_text`], with the lines and indentation a pretty-printed form adds.
pub(crate) fn measure_text(state: &State, value: &Value) -> Result<TextSize, Error> {
    // Strings are the common case and cost what copying them costs.
    if let Some(s) = value.as_str() {
        let len = s.len() as u64;
        pay_bytes(state, len, BYTES_PER_FUEL)?;
        return Ok(TextSize {
            bytes: len,
            lines: 1,
            levels: 0,
        });
    }
    let mut size = TextSize::default();
    let mut unpaid: u64 = 0;
    let mut pending: Vec<(Value, usize)> = vec![(value.clone(), 0)];
    while let Some((v, depth)) = pending.pop() {
        // `'a': ` or `, ` around every item, quotes around strings.
        let (bytes, lines) = match v.kind() {
            ValueKind::String => (v.as_str().map_or(0, |s| s.len() as u64) + 4, 1),
            ValueKind::Seq | ValueKind::Iterable | ValueKind::Map => {
                if depth >= MAX_NESTING {
                    return Err(invalid(format!(
                        "a value nested more than {MAX_NESTING} lists or maps deep cannot be \
                         turned into text"
                    )));
                }
                let is_map = v.kind() == ValueKind::Map;
                for item in v.try_iter()? {
                    // One item at a time, paid for as it is visited: a lazy list of 2^32
                    // items stops here when the fuel is gone.
                    unpaid += 4;
                    if unpaid >= 1024 {
                        pay_bytes(state, unpaid, SERIALIZED_BYTES_PER_FUEL)?;
                        unpaid = 0;
                    }
                    if is_map {
                        let field = v.get_item(&item)?;
                        pending.push((field, depth + 1));
                    }
                    pending.push((item, depth + 1));
                }
                // Its opening and its closing line.
                (2, 2)
            }
            _ => (32, 1),
        };
        size.bytes = size.bytes.saturating_add(bytes);
        size.lines = size.lines.saturating_add(lines);
        size.levels = size
            .levels
            .saturating_add(lines.saturating_mul(depth as u64 + 1));
        unpaid += bytes;
        if unpaid >= 1024 {
            pay_bytes(state, unpaid, SERIALIZED_BYTES_PER_FUEL)?;
            unpaid = 0;
        }
    }
    pay_bytes(state, unpaid, SERIALIZED_BYTES_PER_FUEL)?;
    Ok(size)
}

/// Refuses to build `bytes` of data (an upper bound on what `what` is about to make, `how`
/// saying how it was found) unless the fuel left could pay for them; nothing is consumed, as
/// the engine charges for the result once it exists. Output that can be far larger than its
/// input is checked so before it is allocated.
fn ensure_bytes(state: &State, bytes: u64, what: &str, how: &str) -> Result<(), Error> {
    let Some((_, remaining)) = state.fuel_levels() else {
        return Ok(());
    };
    if bytes / BYTES_PER_FUEL >= remaining {
        return Err(Error::new(
            ErrorKind::OutOfFuel,
            format!(
                "{what}: the result could take {bytes} bytes ({how}), more than the {} bytes \
                 the fuel left pays for",
                remaining.saturating_mul(BYTES_PER_FUEL)
            ),
        ));
    }
    Ok(())
}

/// [`ensure_bytes`] for output that grows step by step (`strftime_now`'s), `bytes` being what
/// it will have reached at the next check.
pub(crate) fn ensure_output(state: &State, bytes: u64, what: &str) -> Result<(), Error> {
    ensure_bytes(state, bytes, what, "as far as the text has grown")
}

/// Pays for visiting the items of `value` (a list an operation is about to walk), half a fuel
/// an item as minijinja's own list filters pay; a list of unknown length is counted as it is
/// paid for. Returns how many items it has (at most [`MAX_LIST_ITEMS`] + 1 when unknown).
fn pay_for_items(state: &State, value: &Value, what: &str) -> Result<usize, Error> {
    let n = list_len(state, value)?;
    if n > MAX_LIST_ITEMS {
        return Err(invalid(format!(
            "{what}: a list of more than {MAX_LIST_ITEMS} items, the most a chat template may \
             walk"
        )));
    }
    state.consume_fuel(n as u64 / 2)?;
    Ok(n)
}

/// The number of items of a list about to be concatenated; a list without a known length is
/// counted (paid for per item, and no further than [`MAX_LIST_ITEMS`] + 1).
fn list_len(state: &State, value: &Value) -> Result<usize, Error> {
    if let Some(n) = value.len() {
        return Ok(n);
    }
    let mut n = 0usize;
    for _ in value.try_iter()? {
        n += 1;
        if n.is_multiple_of(64) {
            state.consume_fuel(1)?;
        }
        if n > MAX_LIST_ITEMS {
            break;
        }
    }
    Ok(n)
}

fn is_list(value: &Value) -> bool {
    matches!(value.kind(), ValueKind::Seq | ValueKind::Iterable)
}

/// Checks (and pays for) a concatenation of the lists `values` before it is made; `what`
/// names the operation for the message.
fn check_lists(state: &State, values: &[&Value], what: &str) -> Result<(), Error> {
    let mut total = 0usize;
    for v in values.iter().filter(|v| is_list(v)) {
        total = total.saturating_add(list_len(state, v)?);
    }
    if total > MAX_LIST_ITEMS {
        return Err(invalid(format!(
            "{what} would make a list of {total} items, more than {MAX_LIST_ITEMS}, the most a \
             chat template may build"
        )));
    }
    // Two items per fuel: the lazy concatenation is copied out when chained deep.
    state.consume_fuel(total as u64 / 2)
}

/// minijinja's own `a + b` or `a ~ b`, once the operands are known to be of bounded size.
fn builtin(state: &State, expr: &str, a: &Value, b: &Value) -> Result<Value, Error> {
    let compiled = state.env().compile_expression(expr)?;
    compiled.eval(Value::from_pairs([("a", a.clone()), ("b", b.clone())]))
}

/// The template's `a + b`.
pub(crate) fn add(state: &State, a: Value, b: Value) -> Result<Value, Error> {
    if let (Some(x), Some(y)) = (a.as_str(), b.as_str()) {
        pay_bytes(state, (x.len() + y.len()) as u64, BYTES_PER_FUEL)?;
        let s = [x, y].concat();
        return Ok(if a.is_safe() && b.is_safe() {
            Value::from_safe_string(s)
        } else {
            Value::from(s)
        });
    }
    // Small integers, the other common case (`loop.index0 + 1`).
    if let (Some(x), Some(y)) = (small_int(&a), small_int(&b)) {
        if let Some(sum) = x.checked_add(y) {
            return Ok(Value::from(sum));
        }
    }
    if is_list(&a) && is_list(&b) {
        check_lists(state, &[&a, &b], "+")?;
    }
    // Numbers, tuples, bounded lists and the errors for operands `+` does not take.
    builtin(state, "a + b", &a, &b)
}

fn small_int(v: &Value) -> Option<i64> {
    if v.kind() == ValueKind::Number && v.is_integer() {
        i64::try_from(v.clone()).ok()
    } else {
        None
    }
}

/// The template's `a ~ b`.
pub(crate) fn concat(state: &State, a: Value, b: Value) -> Result<Value, Error> {
    pay_for_text(state, &a)?;
    pay_for_text(state, &b)?;
    builtin(state, "a ~ b", &a, &b)
}

/// Writes `{{ value }}`: containers are measured (and paid for) before they are written.
pub(crate) fn formatter(out: &mut Output, state: &mut State, value: &Value) -> Result<(), Error> {
    if value.as_str().is_none() {
        pay_for_text(state, value)?;
    }
    minijinja::escape_formatter(out, state, value)
}

/// Refuses to wrap `items` in one more list or map if that would nest deeper than
/// [`MAX_NESTING`]: minijinja prints, compares and frees nested values by recursion, and a
/// list wrapped in a list 100,000 times (a loop of `{% set ns.l = [ns.l] %}`) overflows the
/// stack even when nothing prints it. The walk is paid for, one fuel per 16 values.
fn check_nesting(state: &State, items: &[Value], what: &str) -> Result<(), Error> {
    let mut pending: Vec<(Value, usize)> = items.iter().map(|v| (v.clone(), 1)).collect();
    let mut visited: u64 = 0;
    while let Some((v, depth)) = pending.pop() {
        visited += 1;
        if visited.is_multiple_of(16) {
            state.consume_fuel(1)?;
        }
        // Lazy lists (`a + b`, `l * 3`, `map`) are iterables: they nest what they hold too.
        if !matches!(
            v.kind(),
            ValueKind::Seq | ValueKind::Iterable | ValueKind::Map
        ) {
            continue;
        }
        if depth >= MAX_NESTING {
            return Err(invalid(format!(
                "{what}: lists and maps nested more than {MAX_NESTING} deep (or a namespace that \
                 holds itself), more than a chat template may build or compare"
            )));
        }
        let is_map = v.kind() == ValueKind::Map;
        for item in v.try_iter()?.take(MAX_LIST_ITEMS) {
            if is_map {
                pending.push((v.get_item(&item)?, depth + 1));
            }
            pending.push((item, depth + 1));
        }
    }
    Ok(())
}

/// Names of the functions the comparisons (`==`, `!=`, `<`, `<=`, `>`, `>=`, `in`) are
/// compiled into.
pub(crate) const COMPARISONS: [&str; 7] = [
    "rsd:==", "rsd:!=", "rsd:<", "rsd:<=", "rsd:>", "rsd:>=", "rsd:in",
];

/// Name of the function every link but the last of a chained comparison (`a < b` and `b < c`
/// in `a < b < c < d`) calls before minijinja compares its operands (see [`chained_operands`]).
pub(crate) const CHAINED: &str = "rsd:chained";

/// Checks the operands of a comparison named `what` (`==`, `in`, …) before minijinja compares
/// them: lists and maps (a namespace that holds itself) are walked for nesting (see
/// [`check_nesting`]); strings, numbers and the like need nothing.
fn check_operands(state: &State, a: &Value, b: &Value, what: &str) -> Result<(), Error> {
    if a.as_object().is_some() || b.as_object().is_some() {
        check_nesting(state, &[a.clone(), b.clone()], what)?;
    }
    Ok(())
}

/// The operands `a` and `b` of one link of a chained comparison (`a < b` in `a < b < c`),
/// checked as [`comparison`] checks its operands, then handed back as the list `[b, a]`: the
/// compiled template unpacks it onto the stack (`a`, then `b` on top) and runs minijinja's own
/// instruction for the link, which compares them and keeps `b` for the next one (see
/// `bound_chained_comparisons` in lib.rs). minijinja's instruction names its operator by a type
/// the `unstable_machinery` API does not export, so the operator stays minijinja's and only the
/// operands are checked here.
pub(crate) fn chained_operands(state: &State, a: Value, b: Value) -> Result<Value, Error> {
    check_operands(state, &a, &b, "a chained comparison")?;
    Ok(Value::from(vec![b, a]))
}

/// A comparison (one of [`COMPARISONS`]): minijinja compares lists and maps by recursion, so
/// two namespaces that hold themselves would overflow the stack; the operands are checked for
/// nesting first, then compared as minijinja compares them.
pub(crate) fn comparison(
    name: &'static str,
) -> impl Fn(&State, Value, Value) -> Result<Value, Error> {
    move |state: &State, a: Value, b: Value| {
        let op = name.trim_start_matches("rsd:");
        check_operands(state, &a, &b, op)?;
        Ok(Value::from(match op {
            "==" => a == b,
            "!=" => a != b,
            "<" => a < b,
            "<=" => a <= b,
            ">" => a > b,
            ">=" => a >= b,
            _ => return builtin(state, "a in b", &a, &b),
        }))
    }
}

/// The comparison tests (`x is eq(y)`, `x is in(l)`, …, and `select('==', y)` and the like),
/// checked as [`comparison`] checks the operators, by the operator name (`==`, `in`, …).
pub(crate) fn comparison_test(
    op: &'static str,
) -> impl Fn(&State, Value, Value) -> Result<bool, Error> {
    move |state: &State, a: Value, b: Value| {
        check_operands(state, &a, &b, op)?;
        Ok(match op {
            "==" => a == b,
            "!=" => a != b,
            "<" => a < b,
            "<=" => a <= b,
            ">" => a > b,
            ">=" => a >= b,
            _ => builtin(state, "a in b", &a, &b)?.is_true(),
        })
    }
}

/// A list literal, `[a, b]`, checked for nesting (see [`check_nesting`]).
pub(crate) fn list(state: &State, items: Rest<Value>) -> Result<Value, Error> {
    check_nesting(state, &items, "a list")?;
    Ok(Value::from(items.0))
}

/// A tuple literal, `(a, b)`, checked for nesting.
pub(crate) fn tuple(state: &State, items: Rest<Value>) -> Result<Value, Error> {
    check_nesting(state, &items, "a tuple")?;
    Ok(Value::from(minijinja::value::Tuple::from(items.0)))
}

/// A map literal, `{k: v}` (its keys and values in turn), checked for nesting.
pub(crate) fn map(state: &State, items: Rest<Value>) -> Result<Value, Error> {
    check_nesting(state, &items, "a map")?;
    let pairs = items.0.chunks(2).map(|kv| {
        let key = kv.first().cloned().unwrap_or_default();
        let value = kv.get(1).cloned().unwrap_or_default();
        (key, value)
    });
    Ok(Value::from_pairs(pairs.collect::<Vec<_>>()))
}

/// A filter that turns its input and arguments into text (`lower`, `trim`, `format`, the `join`
/// filter, …): containers among them are measured (and paid for) first, so that neither a huge
/// lazy list nor a value nested past [`MAX_NESTING`] (a namespace that holds itself) is written
/// out by recursion; a filter whose result may be up to `growth` times its input (`upper`
/// turns `ΐ` into three characters, `escape` `'` into `&#x27;`) is checked against the fuel for
/// that first; then `builtin`, minijinja's own filter, runs.
pub(crate) fn text_filter(
    name: &'static str,
    builtin: Value,
    growth: u64,
) -> impl Fn(&mut State, Rest<Value>, Kwargs) -> Result<Value, Error> {
    move |state: &mut State, args: Rest<Value>, kwargs: Kwargs| {
        let mut input: u64 = 0;
        for (i, v) in args.iter().enumerate() {
            let bytes = match v.as_str() {
                Some(s) => s.len() as u64,
                None => pay_for_text(state, v)?,
            };
            if i == 0 {
                input = bytes;
            }
        }
        if growth > 1 {
            ensure_bytes(
                state,
                input.saturating_mul(growth),
                name,
                &format!("{growth} times its input of {input} bytes"),
            )?;
        }
        call_with_kwargs(state, &builtin, args.0, &kwargs)
    }
}

/// The widest indent `indent` may add to a line (the cap `tojson` and `str.format` have).
const MAX_INDENT: usize = MAX_FORMAT_WIDTH;

/// The `indent` filter: `width` spaces before every line (positionally or as `width=`; the
/// first line and blank lines too with `first`/`blank`), which minijinja allocates before it
/// charges for them (`indent(100000000000)` asked for 100 GB). The width is capped and the
/// result's size, `width` × lines + the input, checked against the fuel first; then
/// minijinja's own filter runs, with the arguments as given.
pub(crate) fn indent(state: &mut State, args: Rest<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let input = match args.first() {
        Some(v) if v.as_str().is_none() => {
            pay_for_text(state, v)?;
            None
        }
        Some(v) => v.as_str().map(str::to_string),
        None => None,
    };
    // As minijinja reads it: a positional width (`none` counts as absent), else `width=`.
    let positional = match args.get(1) {
        Some(v) => minijinja::value::from_args::<(Option<usize>,)>(std::slice::from_ref(v))?.0,
        None => None,
    };
    let width = match positional {
        Some(w) => w,
        None => kwargs.peek::<Option<usize>>("width")?.unwrap_or(4),
    };
    if width > MAX_INDENT {
        return Err(invalid(format!(
            "indent: a width of {width} is more than {MAX_INDENT}, the most a chat template may \
             ask for"
        )));
    }
    let text = match input {
        Some(s) => s,
        // A container's text, paid for above; bounded by the fuel, so making it is safe.
        None => match args.first() {
            Some(v) => v.to_string(),
            None => String::new(),
        },
    };
    let lines = text.bytes().filter(|&b| b == b'\n').count() as u64 + 1;
    let bound = (width as u64)
        .saturating_mul(lines)
        .saturating_add(text.len() as u64);
    ensure_bytes(
        state,
        bound,
        "indent",
        &format!("a width of {width} on each of {lines} lines"),
    )?;
    call_with_kwargs(
        state,
        &Value::from_function(minijinja::filters::indent),
        args.0,
        &kwargs,
    )
}

/// The `replace` filter as minijinja registers it (a `count`, positional or `count=`, replaces
/// only the first ones): the replacement's size is checked against the fuel first, assuming
/// every possible match (counting them only when that bound is too large).
pub(crate) fn replace(
    state: &mut State,
    args: Rest<Value>,
    kwargs: Kwargs,
) -> Result<Value, Error> {
    for v in args.iter().filter(|v| v.as_str().is_none()) {
        pay_for_text(state, v)?;
    }
    let (value, from, to, count): (&Value, &Value, &Value, Option<i64>) =
        minijinja::value::from_args(&args)?;
    let count = match count {
        Some(c) => Some(c),
        None => kwargs.get::<Option<i64>>("count")?,
    };
    kwargs.assert_all_used()?;
    let value = minijinja::value::StringInput::new(state, value)?;
    let from = minijinja::value::StringInput::new(state, from)?;
    let to = minijinja::value::StringInput::new(state, to)?;
    // A negative count (or none) replaces every match.
    let count = count
        .and_then(|c| usize::try_from(c).ok())
        .unwrap_or(usize::MAX);
    let safety_aware = !matches!(state.auto_escape(), minijinja::AutoEscape::None)
        && (value.is_safe() || from.is_safe() || to.is_safe());
    if safety_aware {
        let v = value.format(state)?.into_owned();
        let t = to.format(state)?.into_owned();
        check_replace(state, &v, from.as_str(), &t, count)?;
        Ok(Value::from_safe_string(v.replacen(
            from.as_str(),
            &t,
            count,
        )))
    } else {
        check_replace(state, value.as_str(), from.as_str(), to.as_str(), count)?;
        Ok(Value::from(value.as_str().replacen(
            from.as_str(),
            to.as_str(),
            count,
        )))
    }
}

fn check_replace(
    state: &State,
    value: &str,
    from: &str,
    to: &str,
    count: usize,
) -> Result<(), Error> {
    if to.len() <= from.len() {
        return Ok(());
    }
    let size = |matches: usize| {
        (matches as u64)
            .saturating_mul((to.len() - from.len()) as u64)
            .saturating_add(value.len() as u64)
    };
    let most = (value.len() / from.len().max(1) + 1).min(count);
    if ensure_bytes(state, size(most), "replace", "").is_ok() {
        return Ok(());
    }
    let matches = if from.is_empty() {
        most
    } else {
        value.matches(from).take(count).count()
    };
    ensure_bytes(
        state,
        size(matches),
        "replace",
        &format!(
            "{matches} matches of {} bytes replaced by {} bytes",
            from.len(),
            to.len()
        ),
    )
}

/// `groupby` and `dictsort` collect and sort their input whole, and minijinja's functions
/// that rsd can call do so without fuel (a lazy list of 10^8 items took 3 GB): the items are
/// counted (at most [`MAX_LIST_ITEMS`]) and paid for, with the sort, before `builtin` runs, as
/// [`wrapping_function`] runs it.
pub(crate) fn sorting_function(
    name: &'static str,
    builtin: Value,
) -> impl Fn(&mut State, Rest<Value>, Kwargs) -> Result<Value, Error> {
    let wrapped = wrapping_function(name, builtin);
    move |state: &mut State, args: Rest<Value>, kwargs: Kwargs| {
        if let Some(v) = args.first() {
            if matches!(
                v.kind(),
                ValueKind::Seq | ValueKind::Iterable | ValueKind::Map
            ) {
                let n = pay_for_items(state, v, name)? as u64;
                // A comparison per item and level of the sort, as minijinja charges sorting.
                state.consume_fuel(n.saturating_mul(u64::from(u64::BITS - n.leading_zeros())))?;
            }
        }
        wrapped(state, args, kwargs)
    }
}

/// A function that wraps its arguments in a new map (`dict(a=x)`, `namespace(a=x)`): the
/// arguments are checked for nesting first (see [`check_nesting`]), then `builtin` runs.
pub(crate) fn wrapping_function(
    name: &'static str,
    builtin: Value,
) -> impl Fn(&mut State, Rest<Value>, Kwargs) -> Result<Value, Error> {
    move |state: &mut State, args: Rest<Value>, kwargs: Kwargs| {
        check_nesting(state, &args, name)?;
        let values: Vec<Value> = kwargs
            .args()
            .map(|k| kwargs.peek::<Value>(k))
            .collect::<Result<_, _>>()?;
        check_nesting(state, &values, name)?;
        call_with_kwargs(state, &builtin, args.0, &kwargs)
    }
}

/// Calls `builtin` with `args` and the keyword arguments `kwargs`, which then count as used
/// (the builtin checks them itself).
fn call_with_kwargs(
    state: &mut State,
    builtin: &Value,
    mut args: Vec<Value>,
    kwargs: &Kwargs,
) -> Result<Value, Error> {
    let keys: Vec<String> = kwargs.args().map(str::to_string).collect();
    if !keys.is_empty() {
        args.push(Value::from(kwargs.clone()));
    }
    let rv = builtin.call(state, &args)?;
    for k in &keys {
        kwargs.get::<Value>(k)?;
    }
    Ok(rv)
}

/// The `chain` filter, bounded as `+` is.
pub(crate) fn chain(state: &State, value: Value, others: Rest<Value>) -> Result<Value, Error> {
    let mut all: Vec<&Value> = vec![&value];
    all.extend(others.iter());
    if all.iter().all(|v| is_list(v)) {
        check_lists(state, &all, "chain")?;
    }
    minijinja::filters::chain(state, value, others)
}

/// The `tojson` filter, the value measured (and paid for) before it is serialized: minijinja
/// charges as it writes, at a pace that lets a lazy list of 10^8 items run for seconds. The
/// indent (positional or `indent=`, `true` for 2) is capped and repeated on every line once per
/// level of nesting, and escaping a string may make it six times longer (`\u003c` for `<`):
/// the pretty-printed size that allows is checked against the fuel first.
pub(crate) fn tojson(
    state: &State,
    value: &Value,
    indent: Option<Value>,
    kwargs: Kwargs,
) -> Result<Value, Error> {
    let size = measure_text(state, value)?;
    // As minijinja reads it: the positional indent, else `indent=`; a boolean is 2 or none.
    let given = match &indent {
        Some(v) => Some(v.clone()),
        None => kwargs.peek::<Option<Value>>("indent")?,
    };
    let width = match given {
        Some(v) if v.kind() == ValueKind::Bool && v.is_true() => 2,
        Some(v) if v.kind() == ValueKind::Bool => 0,
        Some(v) => usize::try_from(v)?,
        None => 0,
    };
    if width > MAX_FORMAT_WIDTH {
        return Err(invalid(format!(
            "tojson: an indent of {width} is more than {MAX_FORMAT_WIDTH}, the most a chat \
             template may ask for"
        )));
    }
    ensure_bytes(
        state,
        size.pretty(width as u64, 6),
        "tojson",
        &format!("an indent of {width} on each of {} lines", size.lines),
    )?;
    minijinja::filters::tojson(value, indent, kwargs)
}

/// The `string` and `pprint` filters, the value measured (and paid for) first.
pub(crate) fn string(state: &State, value: &Value) -> Result<Value, Error> {
    pay_for_text(state, value)?;
    minijinja::filters::string(state, value)
}

/// The `pprint` filter, the value measured (and paid for) first: Rust's pretty debug form
/// indents every line by four spaces a level and escapes strings (`\u{1}`), so the size that
/// allows is checked against the fuel too.
pub(crate) fn pprint(state: &State, value: &Value) -> Result<String, Error> {
    let size = measure_text(state, value)?;
    ensure_bytes(
        state,
        size.pretty(4, 6),
        "pprint",
        &format!("four spaces a level on each of {} lines", size.lines),
    )?;
    Ok(minijinja::filters::pprint(value))
}

/// The `sum` filter: the items added with the template's bounded `+`.
pub(crate) fn sum(
    state: &State,
    values: Value,
    attribute: Option<String>,
    kwargs: Kwargs,
) -> Result<Value, Error> {
    let attribute = match attribute {
        Some(a) => Some(a),
        None => kwargs.get::<Option<String>>("attribute")?,
    };
    let mut total = kwargs
        .get::<Option<Value>>("start")?
        .unwrap_or(Value::from(0));
    kwargs.assert_all_used()?;
    for item in values.try_iter()? {
        state.consume_fuel(1)?;
        let item = match &attribute {
            Some(path) => path.split('.').try_fold(item, |v, part| v.get_attr(part))?,
            None => item,
        };
        total = add(state, total, item)?;
    }
    Ok(total)
}

/// `str.format` (Python's, from minijinja-contrib's pycompat): widths and precisions are
/// capped, and the size of the result is paid for before it is made.
fn str_format(state: &mut State, s: &str, args: &[Value]) -> Result<Value, Error> {
    let spec = format_fields(s)?;
    let mut widest_arg: u64 = 0;
    for a in args {
        widest_arg = widest_arg.max(pay_for_text(state, a)?);
    }
    // Every field may repeat the widest argument (`'{0}{0}{0}'`), padded to its width.
    let bound = (s.len() as u64)
        .saturating_add(spec.padding)
        .saturating_add(spec.fields.saturating_mul(widest_arg));
    pay_bytes(state, bound, BYTES_PER_FUEL)?;
    minijinja_contrib::pycompat::unknown_method_callback(state, &Value::from(s), "format", args)
}

/// What the replacement fields of a `str.format` string may add: how many fields, and the
/// bytes their widths and precisions may pad to.
#[derive(Debug)]
struct FormatFields {
    fields: u64,
    padding: u64,
}

/// Reads the fields of a `str.format` string: every run of digits after a field's `:` is taken
/// as a width or precision (so a fill character that is a digit only makes the bound larger).
fn format_fields(s: &str) -> Result<FormatFields, Error> {
    let mut fields: u64 = 0;
    let mut padding: u64 = 0;
    let mut rest = s;
    while let Some(open) = rest.find('{') {
        let after = &rest[open + 1..];
        if let Some(escaped) = after.strip_prefix('{') {
            rest = escaped;
            continue;
        }
        let end = after.find('}').unwrap_or(after.len());
        let field = &after[..end];
        fields += 1;
        if let Some((_, spec)) = field.split_once(':') {
            for run in spec.split(|c: char| !c.is_ascii_digit()) {
                if run.is_empty() {
                    continue;
                }
                let n: usize = run.parse().unwrap_or(usize::MAX);
                if n > MAX_FORMAT_WIDTH {
                    return Err(invalid(format!(
                        "str.format: a width or precision of {} is more than {MAX_FORMAT_WIDTH}, \
                         the most a chat template may ask for",
                        rsd_common::printable::shortened(run)
                    )));
                }
                // A fill character takes up to 4 bytes.
                padding = padding.saturating_add(4 * n as u64);
            }
        }
        rest = after.get(end + 1..).unwrap_or("");
    }
    Ok(FormatFields { fields, padding })
}

/// Bytes one item of a list takes (minijinja's `Value`).
const ITEM_BYTES: u64 = 24;

/// Pays for the list that splitting `s` makes before it is made: the pieces are counted
/// first (counting allocates nothing), since a 30 MB string split at every character would
/// make 30 million values before minijinja charges for them. An empty separator is refused,
/// as Python refuses it.
fn pay_for_pieces(state: &State, s: &str, method: &str, args: &[Value]) -> Result<(), Error> {
    let sep = args.first().and_then(Value::as_str);
    let pieces = match (method, sep) {
        ("splitlines", _) => s.lines().count(),
        (_, Some("")) => return Err(invalid(format!("{method}: empty separator"))),
        (_, Some(sep)) => s.matches(sep).count() + 1,
        (_, None) => s.split_whitespace().count(),
    };
    pay_bytes(state, pieces as u64 * ITEM_BYTES, BYTES_PER_FUEL)
}

/// The `split` filter, the pieces counted and paid for first (see [`pay_for_pieces`]).
pub(crate) fn split(
    state: &State,
    value: &Value,
    sep: Option<std::sync::Arc<str>>,
    maxsplits: Option<i64>,
) -> Result<Value, Error> {
    if let Some(s) = value.as_str() {
        let args: Vec<Value> = sep.iter().map(|x| Value::from(x.as_ref())).collect();
        pay_for_pieces(state, s, "split", &args)?;
    }
    minijinja::filters::split(value, sep, maxsplits)
}

/// The `lines` filter, the lines counted and paid for first.
pub(crate) fn lines(state: &State, value: &Value) -> Result<Value, Error> {
    if let Some(s) = value.as_str() {
        pay_for_pieces(state, s, "splitlines", &[])?;
    }
    minijinja::filters::lines(value)
}

/// Python's methods on strings, lists and dicts (minijinja-contrib's pycompat), with
/// `str.format` bounded and `str.join` paid for per item.
pub(crate) fn unknown_method(
    state: &mut State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, Error> {
    if matches!(method, "items" | "values") && value.kind() == ValueKind::Map {
        // Pairs of the map's keys and values one level deeper, or its values in a new list
        // (a namespace's own, if it holds itself).
        check_nesting(state, std::slice::from_ref(value), method)?;
    }
    if method == "count" && value.kind() == ValueKind::Seq {
        // `list.count(x)` compares every item, free in pycompat: a list of 10^5 counted in a
        // loop of 10^5 ran for minutes.
        pay_for_items(state, value, "list.count")?;
    }
    if let Some(s) = value.as_str() {
        match method {
            "format" => return str_format(state, s, args),
            "upper" | "lower" | "title" | "capitalize" => {
                // A character may become three (`ΐ`), so may the string.
                ensure_bytes(
                    state,
                    (s.len() as u64).saturating_mul(3),
                    &format!("str.{method}"),
                    &format!("3 times its input of {} bytes", s.len()),
                )?;
            }
            "startswith" | "endswith" => {
                // Each item of a list of prefixes is tried, free in pycompat.
                if let Some(list) = args.first().filter(|a| is_list(a)) {
                    pay_for_items(state, list, &format!("str.{method}"))?;
                }
            }
            "split" | "splitlines" => pay_for_pieces(state, s, method, args)?,
            "join" => {
                // pycompat's join charges only separators of 64 bytes and more, and not the
                // items: measure the items (and the separators) first.
                if let Some(items) = args.first() {
                    let text = pay_for_text(state, items)?;
                    let n = items.len().unwrap_or(0) as u64;
                    pay_bytes(
                        state,
                        text.saturating_add(n.saturating_mul(s.len() as u64)),
                        BYTES_PER_FUEL,
                    )?;
                }
            }
            _ => {}
        }
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

/// Sets up `env` to bound what a template builds: `+`, `~`, comparisons and literals call the
/// functions of this module (once `compile` has rewritten them), and the formatter,
/// Python's methods and the filters and functions that can build or print without bound are
/// replaced by bounded ones (which then call minijinja's own).
pub(crate) fn install(env: &mut minijinja::Environment<'static>) {
    env.set_unknown_method_callback(unknown_method);
    env.set_formatter(formatter);
    env.add_function(ADD, add);
    env.add_function(CONCAT, concat);
    for name in COMPARISONS {
        env.add_function(name, comparison(name));
    }
    env.add_function(CHAINED, chained_operands);
    for (op, names) in [
        ("==", &["eq", "equalto", "=="][..]),
        ("!=", &["ne", "!="]),
        ("<", &["lt", "lessthan", "<"]),
        ("<=", &["le", "<="]),
        (">", &["gt", "greaterthan", ">"]),
        (">=", &["ge", ">="]),
        ("in", &["in"]),
    ] {
        for name in names {
            env.add_test(*name, comparison_test(op));
        }
    }
    // `debug()` prints the whole state by recursion (a namespace that holds itself, without
    // end); transformers' templates have no such function.
    env.add_function("debug", debug_unavailable);
    env.add_function(LIST, list);
    env.add_function(TUPLE, tuple);
    env.add_function(MAP, map);
    env.add_filter("chain", chain);
    env.add_filter("sum", sum);
    env.add_filter("tojson", tojson);
    env.add_filter("string", string);
    env.add_filter("pprint", pprint);
    env.add_filter("split", split);
    env.add_filter("lines", lines);
    env.add_filter("indent", indent);
    env.add_filter("replace", replace);
    for (name, growth) in [
        // Unicode case mappings make at most three characters of one, of no more bytes each.
        ("lower", 3),
        ("upper", 3),
        ("title", 3),
        ("capitalize", 3),
        ("trim", 1),
        // HTML escaping writes `&#x27;` for `'`.
        ("escape", 6),
        ("e", 6),
        ("safe", 1),
        // Both pay for their output as they build it (minijinja's own checks).
        ("join", 1),
        ("format", 1),
    ] {
        if let Some(builtin) = builtin_filter(name) {
            env.add_filter(name, text_filter(name, builtin, growth));
        }
    }
    // Filters whose result holds their input one level deeper.
    for name in ["batch", "slice", "zip", "items"] {
        if let Some(builtin) = builtin_filter(name) {
            env.add_filter(name, wrapping_function(name, builtin));
        }
    }
    // ... and that sort all of it first.
    for name in ["groupby", "dictsort"] {
        if let Some(builtin) = builtin_filter(name) {
            env.add_filter(name, sorting_function(name, builtin));
        }
    }
    env.add_function(
        "dict",
        wrapping_function("dict", Value::from_function(minijinja::functions::dict)),
    );
    env.add_function(
        "namespace",
        wrapping_function(
            "namespace",
            Value::from_function(minijinja::functions::namespace),
        ),
    );
}

/// minijinja's own filter `name`, as a value to call.
fn builtin_filter(name: &str) -> Option<Value> {
    use minijinja::filters as f;
    Some(match name {
        "lower" => Value::from_function(f::lower),
        "upper" => Value::from_function(f::upper),
        "title" => Value::from_function(f::title),
        "capitalize" => Value::from_function(f::capitalize),
        "trim" => Value::from_function(f::trim),
        "escape" | "e" => Value::from_function(f::escape),
        "safe" => Value::from_function(f::safe),
        "join" => Value::from_function(f::join),
        "format" => Value::from_function(f::format),
        "batch" => Value::from_function(f::batch),
        "slice" => Value::from_function(f::slice),
        "groupby" => Value::from_function(f::groupby),
        "zip" => Value::from_function(f::zip),
        "items" => Value::from_function(f::items),
        "dictsort" => Value::from_function(f::dictsort),
        _ => return None,
    })
}

fn debug_unavailable() -> Result<Value, Error> {
    Err(Error::new(
        ErrorKind::InvalidOperation,
        "debug() is not available in chat templates",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_fields_count_widths_and_skip_escaped_braces() {
        let f = format_fields("{{x}} {0:>10} {:.3f} {name}").unwrap();
        assert_eq!(f.fields, 3);
        assert_eq!(f.padding, 4 * 13);
        let e = format_fields("{:>100000000000}").unwrap_err().to_string();
        assert!(
            e.contains("a width or precision of 100000000000 is more than 65536"),
            "{e}"
        );
        assert!(format_fields("{:99999999999999999999999999}").is_err());
        assert_eq!(format_fields("{").unwrap().fields, 1);
    }
}
