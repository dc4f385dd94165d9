//! Any line of a chat JSONL data file: parsed into messages and rendered with ChatML, or a
//! clear error — never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tinynn_models::chat::ChatTemplate;

const CHATML: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

fuzz_target!(|data: &[u8]| {
    let Ok(line) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(messages) = tinynn_train::data::parse_messages(line) {
        let t = ChatTemplate::new(CHATML.to_string(), "", "");
        let _ = t.render(&messages, false);
    }
});
