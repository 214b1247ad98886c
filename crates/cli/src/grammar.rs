//! cryptsetup's command-line grammar on top of clap's. cryptsetup parses with popt, which
//! takes options anywhere: `cryptsetup -q --pbkdf pbkdf2 luksFormat DEV` and
//! `cryptsetup -d KEY luksOpen DEV NAME` give the action's options before the action.
//! clap wants a subcommand's options after it, so they are moved there before clap
//! parses. Which options take a value is read from clap's own definitions (every
//! subcommand's), so a new option needs nothing here.

use clap::Command;
use std::collections::HashMap;
use std::ffi::OsString;

/// The command line as cryptsetup's grammar wants it: named `name`, and an option given
/// twice (`-q ... -q`, popt's way) is taken once rather than refused.
pub(crate) fn command(cmd: Command, name: &'static str) -> Command {
    fn override_self(c: Command) -> Command {
        c.args_override_self(true).mut_subcommands(override_self)
    }
    let cmd = cmd.name(name).bin_name(name);
    // As `cryptsetup`, `--version` says which cryptsetup it stands in for (scripts compare
    // versions and look for flags: BLKID, the foreign-signature check it makes).
    let cmd = match name {
        "cryptsetup" => cmd.version(concat!(
            "2.6.1 flags: BLKID (cryptblk ",
            env!("CARGO_PKG_VERSION"),
            ")"
        )),
        "integritysetup" => {
            cmd.version(concat!("2.6.1 (cryptblk ", env!("CARGO_PKG_VERSION"), ")"))
        }
        _ => cmd,
    };
    override_self(cmd)
}

/// Whether each option takes a value, by spelling (`--key-file`, `-d`), over the root
/// command and every subcommand.
#[derive(Default)]
struct OptionTable {
    takes_value: HashMap<String, bool>,
}

impl OptionTable {
    fn of(cmd: &Command) -> Self {
        let mut t = OptionTable::default();
        t.add(cmd);
        t
    }

    fn add(&mut self, cmd: &Command) {
        for arg in cmd.get_arguments() {
            if arg.is_positional() {
                continue;
            }
            let value = arg.get_action().takes_values();
            let mut spellings = Vec::new();
            if let Some(l) = arg.get_long() {
                spellings.push(format!("--{l}"));
            }
            for l in arg.get_all_aliases().into_iter().flatten() {
                spellings.push(format!("--{l}"));
            }
            if let Some(s) = arg.get_short() {
                spellings.push(format!("-{s}"));
            }
            for s in arg.get_all_short_aliases().into_iter().flatten() {
                spellings.push(format!("-{s}"));
            }
            for s in spellings {
                *self.takes_value.entry(s).or_insert(false) |= value;
            }
        }
        for sub in cmd.get_subcommands() {
            self.add(sub);
        }
    }

    fn takes_value(&self, spelling: &str) -> bool {
        self.takes_value.get(spelling).copied().unwrap_or(false)
    }

    /// How many arguments the option at `args[i]` spans (itself and its value), or
    /// `None` when `args[i]` is not an option.
    fn span(&self, args: &[OsString], i: usize) -> Option<usize> {
        let raw = args[i].as_encoded_bytes();
        if raw == b"-" || !raw.starts_with(b"-") {
            return None;
        }
        // An option whose value is not UTF-8 (`--key-file=<bytes>`): the spelling before
        // '=' is what counts.
        let lossy = args[i].to_string_lossy();
        let tok: &str = &lossy;
        if tok.starts_with("--") {
            if tok.contains('=') {
                return Some(1);
            }
            return Some(if self.takes_value(tok) { 2 } else { 1 });
        }
        // A short cluster (`-qv`, `-dKEY`): the first letter that takes a value takes
        // the rest of the token, or the next argument when nothing follows it.
        let letters: Vec<char> = tok[1..].chars().collect();
        for (n, c) in letters.iter().enumerate() {
            if self.takes_value(&format!("-{c}")) {
                return Some(if n + 1 == letters.len() { 2 } else { 1 });
            }
        }
        Some(1)
    }
}

/// integritysetup's command line as cryptblk's, before [`normalize`]: its `-s` is the
/// sector size and `-t` the tag size (cryptblk's `--key-size` and `--timeout`), and
/// `--no-wipe` is `--integrity-no-wipe`. Arguments after `--` are left alone.
pub(crate) fn integritysetup_spelling(argv: Vec<OsString>) -> Vec<OsString> {
    let mut out = Vec::with_capacity(argv.len());
    let mut rest = false;
    for (i, a) in argv.into_iter().enumerate() {
        if i == 0 || rest {
            out.push(a);
            continue;
        }
        let s = a.to_string_lossy();
        let mapped = match s.as_ref() {
            "--" => {
                rest = true;
                None
            }
            "-s" => Some("--sector-size".to_string()),
            "-t" => Some("--tag-size".to_string()),
            _ if s.starts_with("-s") && s.len() > 2 && !s.starts_with("--") => {
                Some(format!("--sector-size={}", &s[2..]))
            }
            _ if s.starts_with("-t") && s.len() > 2 && !s.starts_with("--") => {
                Some(format!("--tag-size={}", &s[2..]))
            }
            _ => None,
        };
        out.push(mapped.map_or(a, OsString::from));
    }
    out
}

/// integritysetup's actions on cryptblk's: `format`, `open` and `dump` of a standalone
/// integrity volume (`--type integrity`); `close`, `status` and `resize` as they are,
/// resize's `--wipe` dropped (cryptblk's growth always seals the new blocks as zeros).
/// `argv` is [`normalize`]d (the action is `argv[1]`).
pub(crate) fn integritysetup_action(mut argv: Vec<OsString>) -> Vec<OsString> {
    if argv.get(1).is_some_and(|a| a == "resize") {
        let end = argv.iter().position(|a| a == "--").unwrap_or(argv.len());
        let rest = argv.split_off(end);
        argv.retain(|a| a != "--wipe");
        argv.extend(rest);
    }
    if argv
        .get(1)
        .is_some_and(|a| a == "format" || a == "open" || a == "dump")
    {
        argv.insert(2, "--type".into());
        argv.insert(3, "integrity".into());
    }
    argv
}

/// `argv` with every option given before the action moved after it (the program name
/// stays first). Arguments after `--` are never moved.
pub(crate) fn normalize(cmd: &Command, argv: Vec<OsString>) -> Vec<OsString> {
    let table = OptionTable::of(cmd);
    let mut args = argv;
    let mut i = 1;
    let mut before = Vec::new();
    while i < args.len() {
        if args[i] == "--" {
            return args;
        }
        match table.span(&args, i) {
            Some(n) => {
                let end = (i + n).min(args.len());
                before.push(i..end);
                i = end;
            }
            None => break,
        }
    }
    if i >= args.len() {
        return args; // no action
    }
    // args = [prog, OPTIONS..., ACTION, REST...] -> [prog, ACTION, OPTIONS..., REST...]
    if !before.is_empty() {
        let action = args.remove(i);
        args.insert(1, action);
    }
    legacy_action(&table, args)
}

/// cryptsetup's older spellings of an action with a type (`plainOpen`, `tcryptDump`,
/// `create NAME DEVICE`...) as the action and `--type` they stand for; `args[1]` is the
/// action.
fn legacy_action(table: &OptionTable, mut args: Vec<OsString>) -> Vec<OsString> {
    const LEGACY: [(&str, &str, Option<&str>); 15] = [
        ("create", "open", Some("plain")),
        ("plainOpen", "open", Some("plain")),
        ("loopaesOpen", "open", Some("loopaes")),
        ("tcryptOpen", "open", Some("tcrypt")),
        ("bitlkOpen", "open", Some("bitlk")),
        ("fvault2Open", "open", Some("fvault2")),
        ("tcryptDump", "dump", Some("tcrypt")),
        ("bitlkDump", "dump", Some("bitlk")),
        ("fvault2Dump", "dump", Some("fvault2")),
        ("remove", "close", None),
        ("plainClose", "close", None),
        ("loopaesClose", "close", None),
        ("tcryptClose", "close", None),
        ("bitlkClose", "close", None),
        ("fvault2Close", "close", None),
    ];
    let Some(&(old, action, kind)) = args
        .get(1)
        .and_then(|a| LEGACY.iter().find(|(old, ..)| a == *old))
    else {
        return args;
    };
    if old == "create" {
        // `create NAME DEVICE`: the other way round from `open DEVICE NAME`.
        let mut positional = Vec::new();
        let mut j = 2;
        while j < args.len() && positional.len() < 2 {
            if args[j] == "--" {
                positional.extend((j + 1..args.len()).take(2 - positional.len()));
                break;
            }
            match table.span(&args, j) {
                Some(n) => j += n,
                None => {
                    positional.push(j);
                    j += 1;
                }
            }
        }
        if let [a, b] = positional[..] {
            args.swap(a, b);
        }
    }
    args[1] = OsString::from(action);
    if let Some(kind) = kind {
        // Before whatever the line says, so an explicit --type still wins.
        args.splice(2..2, [OsString::from("--type"), OsString::from(kind)]);
    }
    args
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn norm(line: &str) -> String {
        let argv: Vec<OsString> = line.split(' ').map(OsString::from).collect();
        let out = normalize(&command(crate::Cli::command(), "cryptsetup"), argv);
        out.iter()
            .map(|s| s.to_str().unwrap())
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn options_before_the_action_move_after_it() {
        assert_eq!(
            norm("cryptsetup -q --pbkdf pbkdf2 --pbkdf-force-iterations 1000 luksFormat DEV"),
            "cryptsetup luksFormat -q --pbkdf pbkdf2 --pbkdf-force-iterations 1000 DEV"
        );
        assert_eq!(
            norm("cryptsetup -d KEY luksOpen DEV NAME"),
            "cryptsetup luksOpen -d KEY DEV NAME"
        );
        // `--opt=value`, an attached short value, a flag cluster.
        assert_eq!(
            norm("cryptsetup --key-file=- -dKEY -qv luksOpen DEV"),
            "cryptsetup luksOpen --key-file=- -dKEY -qv DEV"
        );
        // A value that looks like an action stays the option's.
        assert_eq!(
            norm("cryptsetup -c luksFormat luksFormat DEV"),
            "cryptsetup luksFormat -c luksFormat DEV"
        );
    }

    #[test]
    fn integritysetups_spelling_becomes_cryptblks() {
        let line = |l: &str| -> String {
            let argv: Vec<OsString> = l.split(' ').map(OsString::from).collect();
            let cmd = command(crate::Cli::command(), "integritysetup");
            let out = integritysetup_action(normalize(&cmd, integritysetup_spelling(argv)));
            out.iter()
                .map(|s| s.to_str().unwrap())
                .collect::<Vec<_>>()
                .join(" ")
        };
        assert_eq!(
            line("integritysetup -q format -s 4096 -t 8 -I sha1 --no-wipe DEV"),
            "integritysetup format --type integrity -q --sector-size 4096 --tag-size 8 -I sha1 --no-wipe DEV"
        );
        assert_eq!(
            line("integritysetup open -B -s512 DEV NAME"),
            "integritysetup open --type integrity -B --sector-size=512 DEV NAME"
        );
        assert_eq!(
            line("integritysetup close NAME"),
            "integritysetup close NAME"
        );
        assert_eq!(
            line("integritysetup resize -q --wipe NAME --device-size 1MiB"),
            "integritysetup resize -q NAME --device-size 1MiB"
        );
        assert_eq!(
            line("integritysetup open --wipe DEV NAME"),
            "integritysetup open --type integrity --wipe DEV NAME"
        );
        assert_eq!(
            line("integritysetup dump -- -s"),
            "integritysetup dump --type integrity -- -s"
        );
    }

    #[test]
    fn older_action_names_become_the_action_and_its_type() {
        assert_eq!(
            norm("cryptsetup create -c aes -h sha256 NAME DEV"),
            "cryptsetup open --type plain -c aes -h sha256 DEV NAME"
        );
        assert_eq!(
            norm("cryptsetup -q tcryptDump --veracrypt DEV"),
            "cryptsetup dump --type tcrypt -q --veracrypt DEV"
        );
        assert_eq!(norm("cryptsetup remove NAME"), "cryptsetup close NAME");
        assert_eq!(
            norm("cryptsetup plainOpen --type luks2 DEV NAME"),
            "cryptsetup open --type plain --type luks2 DEV NAME"
        );
    }

    #[test]
    fn the_command_line_is_well_formed() {
        // clap's own checks: no option spelled twice in a command, `requires` naming
        // options that exist, ...
        command(crate::Cli::command(), "cryptsetup").debug_assert();
        // clap checks that only with debug assertions (not in the `ci` profile): two
        // flattened structs with a field of one name share its value.
        fn unique_ids(cmd: &Command) {
            let mut seen = std::collections::HashSet::new();
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                assert!(
                    seen.insert(id),
                    "{}: argument id '{id}' twice",
                    cmd.get_name()
                );
            }
            cmd.get_subcommands().for_each(unique_ids);
        }
        unique_ids(&crate::Cli::command());
    }

    #[test]
    fn an_option_with_a_value_that_is_not_utf8_is_still_an_option() {
        use std::os::unix::ffi::OsStringExt;
        let argv = vec![
            OsString::from("cryptsetup"),
            OsString::from_vec(b"--key-file=\xff\xfe".to_vec()),
            OsString::from("luksOpen"),
            OsString::from("DEV"),
        ];
        let out = normalize(&command(crate::Cli::command(), "cryptsetup"), argv.clone());
        assert_eq!(
            out,
            vec![
                argv[0].clone(),
                argv[2].clone(),
                argv[1].clone(),
                argv[3].clone()
            ]
        );
    }

    #[test]
    fn lines_already_in_order_are_unchanged() {
        for line in [
            "cryptsetup luksFormat -q DEV KEY",
            "cryptsetup --version",
            "cryptsetup -- luksFormat",
            "cryptsetup luksAddKey DEV -d KEY -",
            "cryptsetup",
        ] {
            assert_eq!(norm(line), line);
        }
    }

    #[test]
    fn no_option_takes_a_value_in_one_command_and_none_in_another() {
        // The table is a union: a spelling that is a flag here and takes a value there
        // would move the wrong argument with it.
        fn walk(cmd: &Command, seen: &mut HashMap<String, (bool, String)>) {
            for arg in cmd.get_arguments().filter(|a| !a.is_positional()) {
                let v = arg.get_action().takes_values();
                let names = arg
                    .get_long()
                    .map(|l| format!("--{l}"))
                    .into_iter()
                    .chain(arg.get_short().map(|s| format!("-{s}")));
                for n in names {
                    let (old, at) = seen
                        .entry(n.clone())
                        .or_insert((v, cmd.get_name().to_string()))
                        .clone();
                    assert_eq!(old, v, "{n}: in {at} and {} differently", cmd.get_name());
                }
            }
            for sub in cmd.get_subcommands() {
                walk(sub, seen);
            }
        }
        walk(&crate::Cli::command(), &mut HashMap::new());
    }
}
