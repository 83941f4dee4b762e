//! Splits a multi-document YAML file on its document markers before anything parses it, so
//! each document stands or falls alone: the YAML parser cannot resynchronise after an error,
//! and one duplicate key used to drop every later document of the file.
//!
//! A line starting with `---` (then a space, a tab or nothing) starts a document; one
//! starting with `...` (likewise) ends one. Both are document markers wherever they stand
//! at the start of a line, even inside a quoted or block scalar (YAML 1.2, 9.1.2), so
//! splitting on them is exact. Text before the first marker, or after a `...`, is a document
//! only if it holds more than blank lines, comments and directives (as libyaml counts them).

/// One document of a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Document<'a> {
    /// 1-based, as problems name documents.
    pub(crate) number: usize,
    /// The line of the file the text starts on (1-based), to report the file's line numbers.
    pub(crate) first_line: usize,
    pub(crate) text: &'a str,
}

/// The documents of `text`, in order.
pub(crate) fn split(text: &str) -> Vec<Document<'_>> {
    let mut docs = Vec::new();
    // Where the current document's text starts, its line, and whether a `---` opened it.
    let mut start = 0;
    let mut start_line = 1;
    let mut explicit = false;
    let mut offset = 0;
    for (n, line) in text.split_inclusive('\n').enumerate() {
        let line_no = n + 1;
        let end = offset + line.len();
        if let Some(after) = marker(line, "---") {
            push(&mut docs, &text[start..offset], start_line, explicit);
            // `--- {a: 1}`: the rest of the line belongs to the document.
            start = end - after.len();
            start_line = line_no;
            explicit = true;
        } else if marker(line, "...").is_some() {
            push(&mut docs, &text[start..offset], start_line, explicit);
            start = end;
            start_line = line_no + 1;
            explicit = false;
        }
        offset = end;
    }
    push(&mut docs, &text[start..], start_line, explicit);
    docs
}

fn push<'a>(docs: &mut Vec<Document<'a>>, text: &'a str, first_line: usize, explicit: bool) {
    if explicit || has_content(text) {
        docs.push(Document {
            number: docs.len() + 1,
            first_line,
            text,
        });
    }
}

/// `line` starts with the marker `m`: returns the rest of the line.
fn marker<'a>(line: &'a str, m: &str) -> Option<&'a str> {
    let rest = line.strip_prefix(m)?;
    match rest.bytes().next() {
        None | Some(b' ' | b'\t' | b'\n' | b'\r') => Some(rest),
        _ => None,
    }
}

fn has_content(text: &str) -> bool {
    text.lines().any(|l| {
        let l = l.trim();
        !(l.is_empty() || l.starts_with('#') || l.starts_with('%'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(text: &str) -> Vec<(usize, usize, &str)> {
        split(text)
            .into_iter()
            .map(|d| (d.number, d.first_line, d.text))
            .collect()
    }

    #[test]
    fn markers_split_and_number_documents_as_libyaml_does() {
        assert_eq!(
            texts("a: 1\n---\nb: 2\n---\n---\nc: 3\n"),
            [
                (1, 1, "a: 1\n"),
                (2, 2, "\nb: 2\n"),
                (3, 4, "\n"),
                (4, 5, "\nc: 3\n")
            ]
        );
        // A leading marker opens the first document; comments before it are no document.
        assert_eq!(texts("# c\n%YAML 1.2\n--- {a: 1}\n"), [(1, 3, " {a: 1}\n")]);
        assert_eq!(texts(""), []);
        assert_eq!(texts("a: 1\n...\n# end\n"), [(1, 1, "a: 1\n")]);
    }

    #[test]
    fn only_whole_markers_at_the_start_of_a_line_split() {
        let text = "a: ---\nb: |\n  ---x\n----\n  ---\n";
        assert_eq!(split(text).len(), 1);
        assert_eq!(split("a: 1\r\n---\r\nb: 2\r\n").len(), 2);
    }

    #[test]
    fn every_document_keeps_its_own_text() {
        let text = "a: 1\na: 2\n---\nkind: List\nitems: []\n";
        let docs = split(text);
        assert_eq!(docs[0].text, "a: 1\na: 2\n");
        assert_eq!(docs[1].text, "\nkind: List\nitems: []\n");
        assert_eq!(docs[1].first_line, 3);
    }
}
