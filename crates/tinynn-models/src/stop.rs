//! Stop strings, matched across token boundaries: text that could still turn into a stop string
//! is held back, so a partial stop string is never printed.

#[derive(Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    pending: String,
}

impl StopMatcher {
    pub fn new(stops: &[String]) -> StopMatcher {
        StopMatcher {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            pending: String::new(),
        }
    }

    /// Adds newly generated text. Returns the text that is safe to show, and whether a stop
    /// string was reached (the stop string and anything after it are dropped).
    pub fn push(&mut self, text: &str) -> (String, bool) {
        self.pending.push_str(text);
        let first_stop = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()))
            .min();
        if let Some(at) = first_stop {
            let out = self.pending[..at].to_string();
            self.pending.clear();
            return (out, true);
        }
        // Hold back the longest tail that is the start of some stop string.
        let hold = self
            .stops
            .iter()
            .flat_map(|s| {
                (1..s.len().min(self.pending.len() + 1))
                    .filter(move |&n| s.is_char_boundary(n))
                    .map(move |n| &s[..n])
            })
            .filter(|prefix| self.pending.ends_with(prefix))
            .map(str::len)
            .max()
            .unwrap_or(0);
        let cut = self.pending.len() - hold;
        let out = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        (out, false)
    }

    /// Text held back when generation ends without reaching a stop string.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stops_across_pieces_and_never_shows_a_partial_stop() {
        let mut m = StopMatcher::new(&["\nUser:".to_string(), "###".to_string()]);
        assert_eq!(m.push("Hello"), ("Hello".to_string(), false));
        assert_eq!(m.push(" there\nUs"), (" there".to_string(), false));
        assert_eq!(m.push("er: hi"), (String::new(), true));
        let mut m = StopMatcher::new(&["###".to_string()]);
        assert_eq!(m.push("a#"), ("a".to_string(), false));
        assert_eq!(m.push("b"), ("#b".to_string(), false));
        assert_eq!(m.push("##"), (String::new(), false));
        assert_eq!(m.finish(), "##");
        let mut none = StopMatcher::new(&[]);
        assert_eq!(none.push("text"), ("text".to_string(), false));
    }

    #[test]
    fn handles_multibyte_stop_strings() {
        let mut m = StopMatcher::new(&["—end".to_string()]);
        assert_eq!(m.push("ok —"), ("ok ".to_string(), false));
        assert_eq!(m.push("en"), (String::new(), false));
        assert_eq!(m.push("d!"), (String::new(), true));
    }
}
